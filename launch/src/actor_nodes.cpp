// Actor nodes: the node launcher's supervision loop (see actor_nodes.h). Its actors reach
// the head's server themselves; nothing here reads or writes a group, a weight or a kernel.
#include "actor_nodes.h"

#include <signal.h>
#include <unistd.h>

#include <thread>

#include "kf/actors/actors.h"
#include "kf/common/error.h"
#include "kf/common/log.h"
#include "kf/replay/replay.h"
#include "launch_common.h"
#include "supervisor.h"

namespace kf::launch {
namespace {
using namespace std::chrono_literals;
}  // namespace

void preflight_actor_node(const Config& cfg) {
  (void)replay::run_shm_config(cfg);
  const auto ao = actors::actor_options(cfg, 0);
  (void)actors::load_actor_tasks(ao, /*strict=*/true);
  if (access(actors::resolve_tree_path(ao.template_path).c_str(), R_OK) != 0)
    throw Error("actors.prompt.template: cannot read " + ao.template_path);
  check_run_name(cfg.get_string("run.name"), "run.name");
  if (cfg.get_int("actors.count") < 1) throw Error("actors.count: must be >= 1");
  if (ao.device.rfind("cuda", 0) == 0 && cuda_device_count() == 0)
    throw Error("actors.device: " + ao.device + " but no GPU is visible on this actor node (use cpu)");
  (void)cluster_options(cfg);
}

int run_actor_node(const Config& cfg, const RunDir& run, const std::string& worker_config,
                   const std::string& binary_dir, const std::atomic<int>* signals) {
  const ClusterOptions co = cluster_options(cfg);
  const std::string bin = binary_dir + "/actors/kf-actor";
  if (access(bin.c_str(), X_OK) != 0) throw Error("launch: " + bin + " is not built (run ./setup.sh)");
  if (replay::RunShm::probe(run.shm_key()) == replay::SegmentState::Stale) {
    const auto removed = remove_dead_run_shm(run.shm_key(), /*lock_too=*/false);
    if (!removed.empty())
      log_warn("launch: actor node ", co.node_name, ": removed the shared memory its dead launcher left (",
               removed.size(), " part(s)); what its actors had published stays on the head's server");
  }
  // The node's run shared memory: its actors' control block (heartbeats, counters), and the
  // snapshot store and kernel database they mirror from the head's server.
  auto shm = replay::RunShm::create(run.shm_key(), replay::run_shm_config(cfg));
  HeadWatch head(co);
  const int n = static_cast<int>(cfg.get_int("actors.count"));
  Supervisor sup;
  for (int i = 0; i < n; ++i) {
    WorkerSpec w;
    w.role = "actor";
    w.id = i;
    // The learning-curve probe is the head's actor 0's alone (docs/metrics.md): a node's
    // actor 0 would probe the same versions again into the same run folder.
    w.argv = {bin,           "--run", run.shm_key(),         "--config",
              worker_config, "--id",  std::to_string(i),     "--run-dir",
              run.path(),    "--set", "actors.probe.every=0"};
    w.log_path = run.sub("logs") + "/actor-" + std::to_string(i) + ".out";
    sup.add(w);
  }
  log_info("launch: actor node ", co.node_name, ": ", n, " actor(s) publishing to redis at ", co.host, ":", co.port,
           " (weights and kernels mirrored from there into this node's shared memory); logs in ", run.sub("logs"));
  for (std::size_t i = 0; i < sup.workers().size(); ++i) {
    sup.start(i);
    log_info("launch: started ", sup.workers()[i].name(), " pid ", sup.workers()[i].pid);
  }
  shm->control().set_state(replay::RunState::running);
  // The head's time split, extraction failures and policy lag: this node's actors' counters.
  NodeReporter reporter(co, "actors");
  CounterTotals totals;
  auto node_figures = [&] {
    totals.update(shm->control().peers(std::chrono::hours(1)));
    NodeSeconds s;
    s.generate_s = 1e-3 * static_cast<double>(totals.sum("actor", replay::ControlBlock::kWorkMs));
    s.gpu_wait_s = 1e-3 * static_cast<double>(totals.sum("actor", replay::ControlBlock::kGpuWaitMs));
    s.pushed = totals.sum("actor", replay::counter::kActorPushed);
    s.extraction_failures = totals.sum("actor", replay::counter::kActorExtractFail);
    s.lag_sum = totals.sum("actor", replay::counter::kActorLagSum);
    return s;
  };
  auto next_poll = Clock::now();
  const int max_restarts = static_cast<int>(cfg.get_int("launch.max_restarts"));
  const double backoff = cfg.get_float("launch.restart_backoff_s");
  const double status_every = cfg.get_float("launch.status_every_s");
  auto next_status = Clock::now();
  int handled = 0;
  bool failed = false, stopping = false;
  std::string why;
  auto stop_actors = [&](const std::string& reason) {
    if (stopping) return;
    stopping = true;
    why = reason;
    for (auto& w : sup.workers()) w.restart_pending = false;
    shm->control().set_state(replay::RunState::draining);
    log_info("launch: actor node ", co.node_name, ": ", reason, "; the actors stop");
  };
  for (;;) {
    shm->heartbeat();
    const int sig = signals ? signals->load() : 0;
    if (sig > handled) {
      handled = sig;
      stop_actors("stop signal");
      if (sig >= 2) sup.signal_role("", SIGKILL);
    }
    for (const auto& e : sup.reap()) {
      Worker& w = sup.workers()[e.index];
      if (e.ok()) {
        log_info("launch: ", w.name(), " exited normally");
        continue;
      }
      if (stopping) {
        log_warn("launch: ", w.name(), " ", describe_exit(e), " while stopping");
        continue;
      }
      if (sup.schedule_restart(e.index, max_restarts, backoff)) {
        log_error("launch: ", w.name(), " ", w.last_exit, " (log ", w.spec.log_path, "); restart ", w.deaths, " of ",
                  max_restarts, "; the group it was sampling is not published (the head never counted it)");
      } else {
        failed = true;
        log_error("launch: ", w.name(), " died ", w.deaths, " times (last: ", w.last_exit, "); giving up on it");
      }
    }
    for (std::size_t i : sup.start_due())
      log_info("launch: restarted ", sup.workers()[i].name(), " as pid ", sup.workers()[i].pid);
    // Every round: an actor that exits takes its control-block entry (and its counts) with
    // it, so its last counts are read as soon as they are there.
    const NodeSeconds figures = node_figures();
    if (Clock::now() >= next_poll) {
      next_poll = Clock::now() + 250ms;
      const std::string state = head.run_state();
      if (!stopping && state == "draining") stop_actors("the head's run drains");
      if (!stopping && head.gone()) {
        stop_actors("the head's server has not answered for cluster.redis.gone_after_s (" +
                    std::to_string(co.gone_after.count() / 1000) + " s): the run ended or the head died");
        sup.signal_role("", SIGTERM);  // an actor waiting on the server would wait for nothing
      }
      reporter.report(figures);
    }
    if (sup.settled()) break;
    if (!stopping && Clock::now() >= next_status) {
      const NodeSeconds& f = figures;
      log_info("launch: actor node ", co.node_name, ": ", f.pushed, " candidate(s) published, ", f.extraction_failures,
               " extraction failure(s), policy version ", shm->snapshots().latest().version, "; ", sup.states());
      next_status = Clock::now() + std::chrono::milliseconds(static_cast<long long>(status_every * 1000));
    }
    std::this_thread::sleep_for(stopping ? 100ms : 20ms);
  }
  // The actors are gone: the last figures, marked done (the head's drain waits for it).
  const NodeSeconds secs = node_figures();
  const bool reported = !head.gone() && reporter.finish(secs);
  log_info("launch: actor node ", co.node_name, " finished (", why.empty() ? "every actor exited" : why,
           "): ", secs.pushed, " candidate(s) published, ", secs.extraction_failures,
           " extraction failure(s) scored by the actors, newest policy version here ",
           shm->snapshots().latest().version, "; generate ", secs.generate_s, " s, GPU wait ", secs.gpu_wait_s, " s",
           reported ? " (reported to the head as session " + reporter.session() + ")"
                    : " (not reported: the head's server is gone)");
  shm->shutdown();
  return failed ? 1 : 0;
}

}  // namespace kf::launch
