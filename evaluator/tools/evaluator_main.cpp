// kf-evaluator: the evaluator process of a run (one per GPU, or several on CPU).
//   kf-evaluator --run NAME --config FILE [--set k=v]... [--id N] [--device N] [--run-dir DIR]
// Attaches to the run's shared memory (made by tools/launch), then scores candidates
// (EvaluatorService) until the run stops, or, when it is draining, until the queue is
// empty and no actor process is left.
// The backend is run.backend (auto: CUDA when a GPU is visible); tasks come from tasks.dir.
// With --run-dir, every verdict is also appended to DIR/metrics/verdicts-<id>.jsonl.
// SIGINT/SIGTERM: finish the candidate in hand, then exit 0.
// Exit: 0 stopped cleanly, 2 usage or config error, 3 could not attach / fatal error.
#include <ATen/Parallel.h>
#include <signal.h>

#include "kf/common/cli.h"
#include <atomic>
#include <cstdio>

#include "kf/common/config.h"
#include "kf/common/error.h"
#include "kf/common/log.h"
#include "kf/evaluator/service.h"
#include "kf/tasks/timing.h"

namespace {
std::atomic<bool> g_stop{false};
void on_signal(int) { g_stop = true; }
bool actor_alive(const kf::replay::ControlBlock& ctl) {
  for (const auto& p : ctl.peers(std::chrono::hours(1)))
    if (p.role == "actor" && p.alive) return true;
  return false;
}
}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"KernelForge evaluator process"};
  std::string run, config_file, run_dir;
  std::vector<std::string> sets;
  int id = 0, device = 0;
  app.add_option("--run", run, "run name (its shared memory must exist)")->required();
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
  try {
    const kf::Config cfg = kf::Config::load(config_file, sets);
    eo = kf::evaluator::eval_options(cfg);
    eo.device = device;
    so = kf::evaluator::service_options(cfg);
    so.evaluator_id = id;
    so.stop = &g_stop;
    if (!run_dir.empty()) so.verdict_log = run_dir + "/metrics/verdicts-" + std::to_string(id) + ".jsonl";
    if (eo.cpu_threads > 0) at::set_num_threads(eo.cpu_threads);
  } catch (const std::exception& e) {
    kf::log_error("evaluator ", id, ": bad configuration: ", e.what(), "; exiting");
    return 2;
  }
  try {
    auto shm = kf::replay::RunShm::attach(run);
    kf::evaluator::Evaluator ev(eo);
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
                 ", compile errors ", st.compile_error, "), kernels inserted ", st.kernels_inserted);
    return 0;
  } catch (const std::exception& e) {
    kf::log_error("evaluator ", id, ": fatal: ", e.what(), "; exiting (the launcher restarts evaluators)");
    return 3;
  }
}
