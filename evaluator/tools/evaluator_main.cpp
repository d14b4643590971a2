// kf-evaluator: the evaluator process of a run (one per GPU, or several on CPU).
//   kf-evaluator --run NAME --config FILE [--set k=v]... [--id N] [--device N] [--run-dir DIR]
// Attaches to the run's shared memory (made by tools/launch), then scores candidates
// (EvaluatorService) until the run stops, or, when it is draining, until the queue is
// empty and no actor process is left.
// The backend is run.backend (auto: CUDA when a GPU is visible); tasks come from tasks.dir.
// With --run-dir, every verdict is also appended to DIR/metrics/verdicts-<id>.jsonl.
// Candidates in KernelBench's format (Python defining class ModelNew) are verified by
// evaluator/modelnew/ under the same protocol; all others are ABI kernels.
// SIGINT/SIGTERM: finish the candidate in hand, then exit 0.
// Exit: 0 stopped cleanly, 2 usage or config error, 3 could not attach / fatal error.
//
//   kf-evaluator --remote --config FILE [--set k=v]... [--id N] [--device N]
// Remote mode (an evaluator node, cluster.role evaluators): no shared memory. Takes
// candidates from the head's Redis stream kf:candidates (group evaluators, consumer
// <node>:evaluator-<id>:<pid>), verifies each with the same sandboxed Evaluator, and
// ack_forwards its result to kf:results (acknowledgement and result in one atomic step,
// only while the candidate is still this consumer's: a candidate claimed away by another
// evaluator yields one result). A second connection keeps the candidate in hand from
// being claimed while it is verified (keep_alive every claim_idle / 3). What a killed
// remote evaluator held is claimed by another after cluster.redis.claim_idle_s.
// Redis errors are logged and retried; when the server has not answered for
// cluster.redis.gone_after_s (the run ended and the head stopped it, or the head died)
// the process exits 0. Password: the environment variable cluster.redis.password_env.
#include <ATen/Parallel.h>
#include <signal.h>

#include "kf/common/cli.h"
#include <atomic>
#include <cstdio>

#include "kf/common/config.h"
#include "kf/common/error.h"
#include "kf/common/log.h"
#include "kf/evaluator/evaluator.h"
#include "kf/tasks/tasks.h"
#include "modelnew.h"  // KernelBench ModelNew candidates (Python): evaluator/modelnew/

#ifdef KF_HAVE_NETQUEUE
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <map>
#include <mutex>
#include <thread>

#include "kf/netqueue/netqueue.h"
#endif

namespace {
std::atomic<bool> g_stop{false};
void on_signal(int) { g_stop = true; }
bool actor_alive(const kf::replay::ControlBlock& ctl) {
  for (const auto& p : ctl.peers(std::chrono::hours(1)))
    if (p.role == "actor" && p.alive) return true;
  return false;
}

#ifdef KF_HAVE_NETQUEUE
using namespace std::chrono_literals;
using SteadyClock = std::chrono::steady_clock;

// The remote loop (see the header comment). Returns the process's exit code.
int run_remote(const kf::Config& cfg, const kf::evaluator::EvalOptions& eo, const kf::evaluator::ServiceOptions& so,
               int id) {
  namespace nq = kf::netqueue;
  nq::StreamConfig sc;
  sc.host = cfg.get_string("cluster.redis.host");
  sc.port = static_cast<int>(cfg.get_int("cluster.redis.port"));
  const std::string pw_env = cfg.get_string("cluster.redis.password_env");
  const char* pw = std::getenv(pw_env.c_str());
  if (!pw || !*pw) {
    kf::log_error("evaluator ", id, ": cluster.redis.password_env: $", pw_env, " is unset or empty; exiting");
    return 2;
  }
  sc.password = pw;
  sc.bound = static_cast<uint64_t>(cfg.get_int("cluster.redis.bound"));
  sc.claim_idle = std::chrono::milliseconds(static_cast<long long>(cfg.get_float("cluster.redis.claim_idle_s") * 1000));
  std::string node = cfg.get_string("cluster.node_name");
  if (node.empty()) {
    char h[256] = {0};
    node = ::gethostname(h, sizeof h - 1) == 0 && h[0] ? h : "node";
  }
  sc.consumer = node + ":evaluator-" + std::to_string(id) + ":" + std::to_string(::getpid());
  const auto gone_after =
      std::chrono::milliseconds(static_cast<long long>(cfg.get_float("cluster.redis.gone_after_s") * 1000));
  const std::string where = "redis at " + sc.host + ":" + std::to_string(sc.port);

  kf::evaluator::Evaluator ev(eo);
  kf::evaluator::modelnew::Options mo;
  mo.eval = eo;
  const auto score_modelnew = kf::evaluator::modelnew::service_scorer(ev, mo);
  std::map<std::string, std::shared_ptr<const kf::tasks::Task>> tasks;
  // The node's verdict log (--run-dir: <node folder>/metrics/verdicts-<id>.jsonl), the same
  // lines as on one node, so tools/report reads an evaluator node's folder too.
  std::ofstream verdicts;
  if (!so.verdict_log.empty()) {
    verdicts.open(so.verdict_log, std::ios::app);
    if (!verdicts)
      kf::log_error("evaluator ", id, ": cannot open ", so.verdict_log, " for append; scoring goes on without it");
  }
  // The entry being verified, kept claimed by the keep-alive thread.
  std::mutex mu;
  std::string in_hand;
  std::atomic<bool> done{false};
  std::thread keeper([&] {
    std::unique_ptr<nq::StreamQueue> q;
    const auto every = std::max<std::chrono::milliseconds>(sc.claim_idle / 3, 100ms);
    auto next = SteadyClock::now() + every;
    while (!done.load()) {
      std::this_thread::sleep_for(50ms);
      if (SteadyClock::now() < next) continue;
      next = SteadyClock::now() + every;
      std::string idv;
      {
        std::lock_guard<std::mutex> g(mu);
        idv = in_hand;
      }
      if (idv.empty()) continue;
      try {
        if (!q) q = std::make_unique<nq::StreamQueue>(nq::StreamQueue::open(sc));
        if (q->keep_alive({idv}) == 0)
          kf::log_warn("evaluator ", id, ": entry ", idv,
                       " is no longer ours (claimed by another evaluator); "
                       "its result will be dropped as late");
      } catch (const std::exception& e) {
        kf::log_warn("evaluator ", id, ": keep-alive of entry ", idv, " failed: ", e.what(),
                     "; retried at the next beat");
        q.reset();
      }
    }
  });
  struct Join {
    std::atomic<bool>& d;
    std::thread& t;
    ~Join() {
      d = true;
      t.join();
    }
  } join{done, keeper};

  std::unique_ptr<nq::StreamQueue> q;
  // Since when the server has not answered (from the start: the head may come up later).
  auto quiet_since = SteadyClock::now();
  bool failing = true;
  uint64_t scored = 0, ok = 0, late = 0;
  kf::log_info("evaluator ", id, ": remote mode, consumer ", sc.consumer, " of ", where, " stream ", sc.stream,
               ", backend ", kf::tasks::backend_name(so.backend), ", tasks from ", so.tasks_dir);
  while (!g_stop) {
    std::vector<nq::Message> msgs;
    try {
      if (!q) q = std::make_unique<nq::StreamQueue>(nq::StreamQueue::open(sc));
      msgs = q->take(1, 1000ms);
      if (failing) kf::log_info("evaluator ", id, ": ", where, " answers");
      failing = false;
    } catch (const std::exception& e) {
      if (!failing) quiet_since = SteadyClock::now();
      const double quiet = std::chrono::duration<double>(SteadyClock::now() - quiet_since).count();
      if (SteadyClock::now() - quiet_since > gone_after) {
        kf::log_info("evaluator ", id, ": ", where, " has not answered for ", quiet,
                     " s (cluster.redis.gone_after_s): the run has ended or its head is gone; exiting after ", scored,
                     " candidate(s) scored");
        return 0;
      }
      if (!failing || quiet < 1.5)
        kf::log_warn("evaluator ", id, ": ", e.what(),
                     "; retrying every 1 s (gives up after cluster.redis.gone_after_s)");
      failing = true;
      q.reset();
      std::this_thread::sleep_for(1s);
      continue;
    }
    for (const auto& m : msgs) {
      kf::replay::Candidate c;
      kf::evaluator::Result r;
      int level = 0;
      try {
        c = kf::replay::decode_candidate(reinterpret_cast<const unsigned char*>(m.data.data()), m.data.size(),
                                         where + " entry " + m.id);
      } catch (const std::exception& e) {
        kf::log_error("evaluator ", id, ": ", kf::message_of(e), "; scored runtime_error (environment)");
        c = kf::replay::Candidate{};
        c.id = m.tag;
        r.verdict = kf::evaluator::Verdict::runtime_error;
        r.cause = kf::evaluator::Cause::environment;
        r.reason = "the candidate record did not decode";
        r.reward = ev.reward_model().failure_reward(r.verdict);
      }
      if (m.deliveries > 1)
        kf::log_warn("evaluator ", id, ": candidate ", m.tag, " (entry ", m.id,
                     ") was claimed from a dead or stalled "
                     "evaluator (delivery ",
                     m.deliveries, "); scoring it here");
      if (c.id == m.tag && !c.task.empty()) {
        {
          std::lock_guard<std::mutex> g(mu);
          in_hand = m.id;
        }
        auto fail = [&](kf::evaluator::Verdict v, const std::string& why, kf::evaluator::Cause cause) {
          r = kf::evaluator::Result{};
          r.task = c.task;
          r.verdict = v;
          r.cause = cause;
          r.reason = why;
          r.reward = ev.reward_model().failure_reward(v);
        };
        if (c.source.empty()) {
          fail(kf::evaluator::Verdict::compile_error,
               c.extraction_error.empty() ? "no kernel source" : c.extraction_error, kf::evaluator::Cause::kernel);
        } else {
          std::shared_ptr<const kf::tasks::Task> t;
          try {
            auto it = tasks.find(c.task);
            if (it == tasks.end()) {
              t = kf::tasks::Task::load(so.tasks_dir + "/" + c.task);
              if (!t->has_backend(so.backend))
                throw kf::Error("task '" + c.task + "' has no " + kf::tasks::backend_name(so.backend) +
                                " artifact in " + so.tasks_dir);
              tasks[c.task] = t;
            } else {
              t = it->second;
            }
            level = t->level();
            r = kf::evaluator::modelnew::is_modelnew_source(c.source) ? score_modelnew(*t, so.backend, c.source, c.id)
                                                                      : ev.evaluate(*t, so.backend, c.source, c.id);
          } catch (const std::exception& e) {
            kf::log_error("evaluator ", id, ": verifying candidate ", c.id, " failed: ", kf::message_of(e),
                          "; scored runtime_error (environment), the evaluator goes on");
            fail(kf::evaluator::Verdict::runtime_error, std::string("evaluator error: ") + kf::message_of(e),
                 kf::evaluator::Cause::environment);
          }
        }
      }
      const kf::replay::Result rec = kf::evaluator::to_record(r, c, id, so.train_on_degenerate_tasks);
      std::string bytes(kf::replay::encoded_size(rec), '\0');
      kf::replay::encode(rec, reinterpret_cast<unsigned char*>(bytes.data()));
      // The result and the acknowledgement go in one step; on an error, retried until the
      // server is gone (the entry stays pending, so nothing is lost either way).
      for (auto since = SteadyClock::now();;) {
        try {
          if (!q) q = std::make_unique<nq::StreamQueue>(nq::StreamQueue::open(sc));
          std::vector<bool> first;
          q->ack_forward({m.id}, {{c.id, bytes}}, "kf:results", &first);
          ++scored;
          if (r.ok()) ++ok;
          if (first.empty() || !first[0]) {
            ++late;
            kf::log_warn("evaluator ", id, ": candidate ", c.id,
                         " was claimed by another evaluator meanwhile; "
                         "its result from here is dropped (the other one counts)");
          }
          break;
        } catch (const std::exception& e) {
          q.reset();
          if (SteadyClock::now() - since > gone_after) {
            kf::log_error("evaluator ", id, ": the result of candidate ", c.id, " could not be stored: ", e.what(),
                          "; the server is gone, exiting");
            return 0;
          }
          kf::log_warn("evaluator ", id, ": storing the result of candidate ", c.id, " failed: ", e.what(),
                       "; retrying in 1 s");
          std::this_thread::sleep_for(1s);
        }
      }
      {
        std::lock_guard<std::mutex> g(mu);
        in_hand.clear();
      }
      if (verdicts.is_open()) {
        verdicts << kf::evaluator::verdict_json_line(c, r, level, id) << '\n' << std::flush;
        if (!verdicts) {
          kf::log_error("evaluator ", id, ": writing ", so.verdict_log, " failed; the verdict log stops here");
          verdicts.close();
        }
      }
      kf::log_info("evaluator ", id, ": candidate ", c.id, " of ", c.task, " (level ", level,
                   "): ", kf::evaluator::verdict_name(r.verdict),
                   r.reason.empty() ? "" : " (" + r.reason.substr(0, 300) + ")",
                   r.ok() ? ", speedup " + std::to_string(r.speedup) : "");
    }
  }
  kf::log_info("evaluator ", id, ": exiting on a signal; scored ", scored, " (ok ", ok, ", late ", late, ")");
  return 0;
}
#endif
}  // namespace

int main(int argc, char** argv) {
  kf::evaluator::exec_with_worker_openmp();  // OpenMP threads sleep when they wait, as the worker's (evaluator.h)
  CLI::App app{"KernelForge evaluator process"};
  std::string run, config_file, run_dir;
  std::vector<std::string> sets;
  int id = 0, device = 0;
  bool remote = false;
  app.add_option("--run", run, "run name (its shared memory must exist; not with --remote)");
  app.add_flag("--remote", remote, "take candidates from the head's Redis server (cluster.redis.*), not shared memory");
  app.add_option("--config", config_file, "the run's config (YAML)")->required();
  app.add_option("--set", sets, "config override key=value");
  app.add_option("--id", id, "evaluator id (log lines, counters)");
  app.add_option("--device", device, "CUDA device (after CUDA_VISIBLE_DEVICES)");
  app.add_option("--run-dir", run_dir, "the run folder: verdicts go to <dir>/metrics/verdicts-<id>.jsonl");
  KF_CLI_PARSE(app, argc, argv);
  kf::log_init("evaluator", id);
  signal(SIGINT, on_signal);
  signal(SIGTERM, on_signal);

  kf::evaluator::EvalOptions eo;
  kf::evaluator::ServiceOptions so;
  kf::Config remote_cfg;
  try {
    const kf::Config cfg = kf::Config::load(config_file, sets);
    eo = kf::evaluator::eval_options(cfg);
    eo.device = device;
    so = kf::evaluator::service_options(cfg);
    so.evaluator_id = id;
    so.stop = &g_stop;
    if (!run_dir.empty()) so.verdict_log = run_dir + "/metrics/verdicts-" + std::to_string(id) + ".jsonl";
    if (eo.cpu_threads > 0) at::set_num_threads(eo.cpu_threads);
    if (remote) {
#ifndef KF_HAVE_NETQUEUE
      throw kf::Error("--remote: this build has no Redis queue (hiredis was not found; run ./setup.sh)");
#endif
      remote_cfg = cfg;
    } else if (run.empty()) {
      throw kf::Error("--run NAME is required (or --remote)");
    }
  } catch (const std::exception& e) {
    kf::log_error("evaluator ", id, ": bad configuration: ", e.what(), "; exiting");
    return 2;
  }
#ifdef KF_HAVE_NETQUEUE
  if (remote) {
    try {
      return run_remote(remote_cfg, eo, so, id);
    } catch (const std::exception& e) {
      kf::log_error("evaluator ", id, ": fatal: ", kf::message_of(e),
                    "; exiting (the node's launcher restarts evaluators)");
      return 3;
    }
  }
#endif
  try {
    auto shm = kf::replay::RunShm::attach(run);
    kf::evaluator::Evaluator ev(eo);
    kf::evaluator::modelnew::Options mo;
    mo.eval = eo;
    kf::evaluator::modelnew::install_in_service(so, ev, mo);  // KernelBench-format (.py) candidates
    kf::evaluator::EvaluatorService service(ev, *shm, so);
    kf::log_info("evaluator ", id, ": attached to run ", run, ", backend ", kf::tasks::backend_name(so.backend),
                 ", tasks from ", so.tasks_dir);
    while (!g_stop) {
      const auto state = shm->control().state();
      if (state == kf::replay::RunState::stopped) break;
      const std::size_t n = service.step();
      // Draining: leave once the queue is empty and no actor is still finishing a group
      // (its last candidates would otherwise stay unscored).
      if (n == 0 && state == kf::replay::RunState::draining && !actor_alive(shm->control()) &&
          service.pending_retries() == 0)
        break;
    }
    const auto& st = service.stats();
    kf::log_info("evaluator ", id, ": exiting; scored ", st.scored, " (ok ", st.ok, ", cheats ", st.rejected_cheat,
                 ", compile errors ", st.compile_error, "), kernels inserted ", st.kernels_inserted,
                 ", lost because their group was gone ", st.lost_group_gone);
    return 0;
  } catch (const std::exception& e) {
    kf::log_error("evaluator ", id, ": fatal: ", kf::message_of(e), "; exiting (the launcher restarts evaluators)");
    return 3;
  }
}
