// kf-evaluator: the evaluator process of a run (one per GPU, or several on CPU).
//   kf-evaluator --run NAME --config FILE [--set k=v]... [--id N] [--device N] [--run-dir DIR]
//   kf-evaluator --remote --config FILE [--set k=v]... [--id N] [--device N] [--run-dir DIR]
// Scores candidates with EvaluatorService, the same loop in every mode, over the candidate
// source the config picks (kf::transport::open_candidates, docs/architecture.md):
//   --run NAME   attaches to the run's shared memory (made by tools/launch): its control
//                block (registration, counters, run state) and, on one node (cluster.role
//                all), its candidate queue; on the head the candidates come from the head's
//                Redis stream. Runs until the run stops, or, when it is draining, until no
//                candidate is left to claim and no actor process of this node is left.
//   --remote     an evaluator node (cluster.role evaluators): no shared memory. Candidates
//                come from the head's Redis stream (cluster.redis.*; password in the
//                environment variable cluster.redis.password_env); what a killed evaluator
//                held is claimed by another after cluster.redis.claim_idle_s. When the
//                head's server has been gone for cluster.redis.gone_after_s (the run ended
//                and the head stopped it, or the head died) the process exits 0.
// The backend is run.backend (auto: CUDA when a GPU is visible); tasks come from tasks.dir.
// With --run-dir, every verdict is also appended to DIR/metrics/verdicts-<id>.jsonl.
// Candidates in KernelBench's format (Python defining class ModelNew) are verified by
// evaluator/modelnew/ under the same protocol; all others are ABI kernels.
// SIGINT/SIGTERM: finish the candidate in hand, give the rest back, then exit 0.
// Exit: 0 stopped cleanly, 2 usage or config error, 3 could not attach / fatal error.
#include <ATen/Parallel.h>
#include <signal.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>

#include "kf/common/cli.h"
#include "kf/common/config.h"
#include "kf/common/error.h"
#include "kf/common/log.h"
#include "kf/evaluator/evaluator.h"
#include "kf/tasks/tasks.h"
#include "kf/transport/transport.h"
#include "modelnew.h"  // KernelBench ModelNew candidates (Python): evaluator/modelnew/
#include "service.h"   // SourceError
#include "worker_openmp.h"

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
  kf::evaluator::exec_with_worker_openmp();  // OpenMP threads sleep when they wait, as the worker's (worker_openmp.h)
  CLI::App app{"KernelForge evaluator process"};
  std::string run, config_file, run_dir;
  std::vector<std::string> sets;
  int id = 0, device = 0;
  bool remote = false;
  app.add_option("--run", run, "run name (its shared memory must exist; not with --remote)");
  app.add_flag("--remote", remote, "an evaluator node: candidates from the head's Redis server, no shared memory");
  app.add_option("--config", config_file, "the run's config (YAML)")->required();
  app.add_option("--set", sets, "config override key=value");
  app.add_option("--id", id, "evaluator id (log lines, counters)");
  app.add_option("--device", device, "CUDA device (after CUDA_VISIBLE_DEVICES)");
  app.add_option("--run-dir", run_dir, "the run folder: verdicts go to <dir>/metrics/verdicts-<id>.jsonl");
  KF_CLI_PARSE(app, argc, argv);
  kf::log_init("evaluator", id);
  signal(SIGINT, on_signal);
  signal(SIGTERM, on_signal);
  const std::string who = "evaluator " + std::to_string(id);

  kf::evaluator::EvalOptions eo;
  kf::evaluator::ServiceOptions so;
  kf::Config cfg;
  bool network = false;
  try {
    cfg = kf::Config::load(config_file, sets);
    eo = kf::evaluator::eval_options(cfg);
    eo.device = device;
    so = kf::evaluator::service_options(cfg);
    so.evaluator_id = id;
    so.stop = &g_stop;
    if (!run_dir.empty()) so.verdict_log = run_dir + "/metrics/verdicts-" + std::to_string(id) + ".jsonl";
    if (eo.cpu_threads > 0) at::set_num_threads(eo.cpu_threads);
    network = kf::transport::kind_of(cfg) == kf::transport::Kind::network;
    if (remote && !network)
      throw kf::error_at(cfg.source(),
                         "cluster.role: 'all' has no evaluator nodes; --remote needs another role "
                         "(evaluators)");
    if (remote && !kf::transport::network_supported())
      throw kf::Error("--remote: this build has no Redis queue (hiredis was not found; run ./setup.sh)");
    if (!remote && run.empty()) throw kf::Error("--run NAME is required (or --remote)");
    if (network) {
      const std::string pw_env = cfg.get_string("cluster.redis.password_env");
      const char* pw = std::getenv(pw_env.c_str());
      if (!pw || !*pw) throw kf::Error("cluster.redis.password_env: $" + pw_env + " is unset or empty");
    }
  } catch (const std::exception& e) {
    kf::log_error(who, ": bad configuration: ", e.what(), "; exiting");
    return 2;
  }

  std::unique_ptr<kf::replay::RunShm> shm;
  std::unique_ptr<kf::replay::CandidateSource> source;
  std::unique_ptr<kf::evaluator::Evaluator> ev;
  std::unique_ptr<kf::evaluator::EvaluatorService> service;
  try {
    if (!remote) shm = kf::replay::RunShm::attach(run);
    source = kf::transport::open_candidates(cfg, shm.get(), who);
    ev = std::make_unique<kf::evaluator::Evaluator>(eo);
    kf::evaluator::modelnew::Options mo;
    mo.eval = eo;
    kf::evaluator::modelnew::install_in_service(so, *ev, mo);  // KernelBench-format (.py) candidates
    service = std::make_unique<kf::evaluator::EvaluatorService>(*ev, *source, shm ? &shm->control() : nullptr, so);
    kf::log_info(who, ": ", remote ? "evaluator node" : "attached to run " + run, ", candidates from ", source->where(),
                 ", backend ", kf::tasks::backend_name(so.backend), ", tasks from ", so.tasks_dir);
  } catch (const std::exception& e) {
    kf::log_error(who, ": fatal: ", kf::message_of(e), "; exiting (the ", remote ? "node's " : "",
                  "launcher restarts evaluators)");
    return 3;
  }

  auto summary = [&] {
    const auto& st = service->stats();
    kf::log_info(who, ": exiting; scored ", st.scored, " (ok ", st.ok, ", cheats ", st.rejected_cheat,
                 ", compile errors ", st.compile_error, ", late ", st.late, "), kernels inserted ", st.kernels_inserted,
                 ", lost because their group was gone ", st.lost_group_gone);
  };
  try {
    while (!g_stop) {
      const auto state = shm ? shm->control().state() : kf::replay::RunState::running;
      if (state == kf::replay::RunState::stopped) break;
      const std::size_t n = service->step();
      // Draining: leave once nothing is left to claim and no actor is still finishing a group
      // (its last candidates would otherwise stay unscored).
      if (n == 0 && state == kf::replay::RunState::draining && !actor_alive(shm->control()) &&
          service->pending_retries() == 0)
        break;
    }
  } catch (const kf::evaluator::SourceError& e) {
    if (!network) {
      kf::log_error(who, ": fatal: ", kf::message_of(e), "; exiting (the launcher restarts evaluators)");
      return 3;
    }
    // The network source gives up only after cluster.redis.gone_after_s without its server
    // (the run has ended and the head stopped it, or the head died); its message says so.
    kf::log_info(who, ": ", kf::message_of(e), "; exiting after ", service->stats().scored, " candidate(s) scored");
    return 0;
  } catch (const std::exception& e) {
    kf::log_error(who, ": fatal: ", kf::message_of(e), "; exiting (the ", remote ? "node's " : "",
                  "launcher restarts evaluators)");
    return 3;
  }
  summary();
  return 0;
}
