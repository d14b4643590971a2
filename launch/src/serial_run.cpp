// launch.mode: serial — the whole pipeline in the launcher's process (see launcher.h).
#include <chrono>
#include <nlohmann/json.hpp>
#include <thread>

#include "kf/actors/actors.h"
#include "kf/common/error.h"
#include "kf/common/log.h"
#include "kf/common/metrics.h"
#include "kf/evaluator/evaluator.h"
#include "kf/launch/launcher.h"
#include "kf/learner/learner.h"
#include "kf/replay/replay.h"
#include "launch_common.h"
#include "run_monitor.h"

namespace kf::launch {

int run_serial(const Config& cfg, const RunDir& run, const LaunchOptions& opts) {
  using Clock = std::chrono::steady_clock;
  const auto backend = tasks::resolve_backend(cfg.get_string("run.backend"));
  if (replay::RunShm::probe(run.shm_key()) == replay::SegmentState::Stale) {
    std::string list;
    for (const auto& p : remove_dead_run_shm(run.shm_key(), /*lock_too=*/false)) list += (list.empty() ? "" : ", ") + p;
    log_warn("launch: run ", run.name(), ": removed the shared memory its dead launcher left (", list, ")");
  }
  auto shm = replay::RunShm::create(run.shm_key(), replay::run_shm_config(cfg));
  auto& ctl = shm->control();
  RunMonitor monitor(static_cast<std::size_t>(cfg.get_int("launch.stats_window")));
  const double elapsed_base = opts.resumed ? load_launch_state(run, monitor) : 0.0;
  if (opts.resumed) merge_saved_kernels(*shm, run);  // before the checkpoint's own copy: a union

  // Learner: one rank, this process.
  auto lc = learner::learner_config_from(cfg);
  const torch::Device device = backend == tasks::Backend::CUDA ? torch::Device(torch::kCUDA, 0) : torch::kCPU;
  auto comm = learner::make_local_comm();
  // Groups from this process's replay, without waiting: the actor and evaluator below run
  // between the learner's steps in this same thread.
  const auto source = replay::shm_ready_groups(shm->replay(), std::chrono::milliseconds(0));
  learner::LearnerDeps deps;
  deps.comm = comm.get();
  deps.source = source.get();
  deps.snapshots = &shm->snapshots();
  deps.shm = shm.get();
  deps.checkpoint_dir = run.sub("checkpoints");
  deps.device = device;
  learner::Learner learner(lc, deps);
  if (opts.resumed) learner.resume(true);
  learner.publish_snapshot();
  const int learner_slot = ctl.register_process("learner", 0);

  // Actor + evaluator, in this process over the same shared memory.
  auto ao = actors::actor_options(cfg, 0);
  auto policy = actors::load_actor_policy(ao.policy_dir, ao.init_shape, ao.seed, ao.device);
  auto tasks = actors::load_actor_tasks(ao);
  actors::Actor actor(ao, std::move(policy), tasks, *shm);
  evaluator::Evaluator ev(evaluator::eval_options(cfg));
  actors::SerialRunner serial(actor, ev, *shm, tasks, backend, run.sub("metrics") + "/verdicts-0.jsonl");
  ctl.set_state(replay::RunState::running);

  MetricsWriter run_metrics(run.sub("metrics"), "run");
  MetricsWriter learner_metrics(run.sub("metrics"), "learner");
  const auto t0 = Clock::now();
  auto elapsed = [&] { return elapsed_base + std::chrono::duration<double>(Clock::now() - t0).count(); };
  const double budget_s = cfg.get_float("launch.max_minutes") * 60;
  const double status_every = cfg.get_float("launch.status_every_s");
  auto next_status = Clock::now(), next_state_save = Clock::now() + std::chrono::seconds(5);
  std::size_t results_seen = 0;
  std::string reason = "the learner reached learner.steps";
  int64_t ckpt_every = cfg.get_int("learner.checkpoint.every");

  for (;;) {
    shm->heartbeat();
    ctl.heartbeat(learner_slot);
    if (opts.signals && opts.signals->load() > 0) {
      reason = "stop signal";
      break;
    }
    if (lc.steps > 0 && learner.steps_done() >= lc.steps) break;
    if (budget_s > 0 && elapsed() >= budget_s) {
      reason = "launch.max_minutes reached";
      break;
    }
    serial.step();
    const auto& res = serial.results();
    for (; results_seen < res.size(); ++results_seen) monitor.add_result(res[results_seen]);
    if (shm->replay().stats().ready_now >= static_cast<uint64_t>(lc.groups_per_step)) {
      const auto st = learner.step();
      ctl.add_counter(learner_slot, 0, 1);
      auto m = learner::step_scalars(st);
      m.push_back({"updated", st.updated ? 1.0 : 0.0});
      m.push_back({"groups", static_cast<double>(st.groups)});
      m.push_back({"seconds", st.seconds});
      learner_metrics.write(st.step, m);
      if (ckpt_every > 0 && st.step % ckpt_every == 0) {
        learner.checkpoint();
        save_run_outputs(*shm, run, backend);
      }
    }
    if (Clock::now() >= next_state_save) {  // the clock and totals survive a crash of this process
      try {
        save_launch_state(run, monitor, elapsed(), "periodic", learner.version());
      } catch (const std::exception& e) {
        log_error("launch: saving the clock and totals failed: ", e.what(), "; the run goes on");
      }
      next_state_save = Clock::now() + std::chrono::seconds(5);
    }
    monitor.counters().update(ctl.peers(std::chrono::hours(1)));
    if (Clock::now() >= next_status) {
      Status s;
      s.phase = "running (serial)";
      s.elapsed_s = elapsed();
      s.step = learner.steps_done();
      s.step_budget = lc.steps;
      monitor.sample_rates(s.elapsed_s, s);
      s.policy_version = learner.version();
      s.ready_groups = shm->replay().stats().ready_now;
      if (const auto probe = ctl.rendezvous_get("probe", std::chrono::nanoseconds(0))) apply_probe_brief(*probe, s);
      log_info(render_status_line(s));
      run_metrics.write(s.step, status_scalars(s), {{"phase", s.phase}, {"verdicts", s.results.verdicts}});
      next_status = Clock::now() + std::chrono::milliseconds(static_cast<long long>(status_every * 1000));
    }
  }
  ctl.set_state(replay::RunState::stopped);
  log_info("launch: serial run stops (", reason, "); final checkpoint");
  learner.checkpoint();
  save_run_outputs(*shm, run, backend);
  save_launch_state(run, monitor, elapsed(), "end of run", learner.version());
  shm->shutdown();
  log_info("launch: serial run ", run.name(), " finished at step ", learner.steps_done(), "; outputs in ", run.path());
  return 0;
}

}  // namespace kf::launch
