// The launcher of one node's run (cluster.role all) or of a head (kf/launch/launcher.h): it
// starts, watches and restarts the workers, shows the status, drains and stops the run, and
// closes the candidate account. On a head it also runs the Redis server and watches it
// (cluster.h, ClusterWatch); the workers reach the server themselves.
#include "kf/launch/launcher.h"

#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <map>
#include <set>
#include <thread>

#include "cluster.h"
#include "gpu_util.h"
#include "kf/actors/actors.h"
#include "kf/common/error.h"
#include "kf/common/log.h"
#include "kf/common/metrics.h"
#include "kf/evaluator/evaluator.h"
#include "kf/learner/learner.h"
#include "kf/policy/policy.h"
#include "kf/replay/replay.h"
#include "kf/tasks/tasks.h"
#include "launch_common.h"
#include "run_monitor.h"
#include "supervisor.h"

namespace kf::launch {

namespace {
using namespace std::chrono_literals;

bool file_readable(const std::string& p) { return access(p.c_str(), R_OK) == 0; }

// Visible GPUs as CUDA_VISIBLE_DEVICES entries: the launcher's own list if set, else 0..n-1.
std::vector<std::string> visible_gpus(int count) {
  std::vector<std::string> out;
  if (const char* v = std::getenv("CUDA_VISIBLE_DEVICES"); v && *v) {
    out = cuda_visible_entries();
  } else {
    for (int i = 0; i < count; ++i) out.push_back(std::to_string(i));
  }
  if (static_cast<int>(out.size()) > count) out.resize(count);
  return out;
}

std::vector<int> allowed_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  std::vector<int> out;
  if (sched_getaffinity(0, sizeof set, &set) == 0)
    for (int c = 0; c < CPU_SETSIZE; ++c)
      if (CPU_ISSET(c, &set)) out.push_back(c);
  if (out.empty()) out.push_back(0);
  return out;
}
}  // namespace

void check_policy_folder(const std::string& dir) {
  if (!file_readable(dir + "/config.json"))
    throw Error("learner.policy: " + dir + " is not a model folder (no config.json)");
  try {
    (void)policy::load_model_config(dir + "/config.json");
    // Maps every weight file and checks each tensor lies inside it: a truncated or
    // damaged model.safetensors (or shard) is named here, before anything is created.
    (void)policy::StCheckpoint::open(dir);
    if (file_readable(dir + "/tokenizer.json")) (void)policy::Tokenizer::from_file(dir + "/tokenizer.json");
  } catch (const std::exception& e) {
    throw Error(std::string("learner.policy: ") + e.what());
  }
}

void preflight(const Config& cfg) {
  (void)evaluator::eval_options(cfg);
  (void)evaluator::service_options(cfg);
  (void)replay::run_shm_config(cfg);
  const auto ao = actors::actor_options(cfg, 0);
  const auto lc = learner::learner_config_from(cfg);
  // The actors' own selection, strict: an unknown tasks.include name fails here, before
  // anything starts, instead of being left out by every actor.
  (void)actors::load_actor_tasks(ao, /*strict=*/true);
  if (!file_readable(actors::resolve_tree_path(ao.template_path)))
    throw Error("actors.prompt.template: cannot read " + ao.template_path);
  if (!lc.policy.empty()) check_policy_folder(lc.policy);
  // role, addresses, the password's environment variable
  if (cluster_options(cfg).remote() && cfg.get_string("launch.mode") != "cluster")
    throw Error("cluster.role: " + cfg.get_string("cluster.role") +
                " needs launch.mode: cluster (serial runs one process)");
  check_run_name(cfg.get_string("run.name"), "run.name");
  // Without periodic checkpoints a crash of the learner or the launcher loses the run.
  if (cfg.get_int("learner.checkpoint.every") < 1)
    throw Error("learner.checkpoint.every: must be >= 1 in a launched run (got " +
                std::to_string(cfg.get_int("learner.checkpoint.every")) + "); a crash would lose every step");
  if (cfg.get_int("actors.count") < 1) throw Error("actors.count: must be >= 1");
  if (cfg.get_int("launch.evaluators") < 0) throw Error("launch.evaluators: must be >= 0");
  if (cfg.get_int("launch.max_restarts") < 0) throw Error("launch.max_restarts: must be >= 0");
  for (const char* k : {"launch.hang_timeout_s", "launch.drain_timeout_s", "launch.stop_timeout_s",
                        "launch.status_every_s", "launch.metrics_every_s"})
    if (cfg.get_float(k) <= 0) throw Error(std::string(k) + ": must be > 0");
  if (cfg.get_int("launch.stats_window") < 1) throw Error("launch.stats_window: must be >= 1");
  const int gpus = cuda_device_count();
  // The ranks this node runs (cluster.head_learner_ranks puts the rest on learners nodes).
  const int local_ranks = cluster_options(cfg).head_ranks();
  if (local_ranks > 1 && gpus > 0 && local_ranks > gpus)
    throw Error((local_ranks < lc.ranks ? "cluster.head_learner_ranks: " : "learner.dist.ranks: ") +
                std::to_string(local_ranks) + " ranks on this node but " + std::to_string(gpus) + " visible GPUs");
  // A head with cluster.head_actors 0 runs no actor: actors.device is the actor nodes' business.
  const int local_actors = cluster_options(cfg).local_actors(static_cast<int>(cfg.get_int("actors.count")));
  if (local_actors > 0 && ao.device.rfind("cuda", 0) == 0 && gpus == 0)
    throw Error("actors.device: " + ao.device + " but no GPU is visible (use cpu)");
}

std::string binary_dir(const char* argv0) {
  char buf[4096];
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
  std::string self = n > 0 ? std::string(buf, static_cast<std::size_t>(n)) : std::string(argv0);
  auto cut = [](std::string p) { return p.substr(0, p.find_last_of('/')); };
  return cut(cut(self));  // <build>/launch/kf-launch -> <build>
}

namespace {
// A head's network account in checkpoints/launch_state.json: a resumed head closes the
// account of a launcher that died with it.
nlohmann::json account_json(const NetworkAccount& a, bool closed) {
  return {{"created", a.created}, {"scored", a.scored},       {"dead", a.dead},  {"dropped", a.dropped},
          {"queued", a.queued},   {"in_flight", a.in_flight}, {"closed", closed}};
}
}  // namespace

enum class Phase { running, draining, stopping, done };
const char* phase_name(Phase p) {
  switch (p) {
    case Phase::running:
      return "running";
    case Phase::draining:
      return "draining";
    case Phase::stopping:
      return "stopping";
    default:
      return "done";
  }
}

struct Launcher::Impl {
  Config cfg;
  RunDir run;
  LaunchOptions opts;
  tasks::Backend backend;
  std::unique_ptr<replay::RunShm> shm;
  ClusterOptions cluster;  // role head: the Redis server and the launcher's watch on it
  std::unique_ptr<HeadServer> redis;
  std::unique_ptr<ClusterWatch> watch;  // role head: run state out, counts and nodes' reports in
  bool redis_died = false;              // the server died mid-run: the account is its last read
  bool network_stopped = false;         // stop_network ran: the account is final
  Supervisor sup;
  RunMonitor monitor;
  std::unique_ptr<MetricsWriter> metrics;
  GpuUtilization gpu;
  uint64_t notes_missed = 0;  // replay result notes overwritten before the monitor read them
  Phase phase = Phase::running;
  int escalation = 0;  // within a stop phase: 1 SIGTERM sent, 2 SIGKILL sent
  bool failed = false;
  std::string stop_reason;
  Clock::time_point t0 = Clock::now(), phase_since = Clock::now();
  int local_actors = 1;                    // actors this launcher runs (cluster.head_actors on a head)
  Clock::time_point network_idle_since{};  // draining: when the network first had nothing out
  double elapsed_base = 0;                 // seconds of earlier launches of a resumed run
  uint64_t checkpoints_seen = 0;
  int learner_ranks = 1;
  int64_t learner_step = 0;  // rank 0's own step (control-block counter 11 of learner 0)
  Clock::time_point next_state_save = Clock::now();
  bool tty = isatty(1);
  int status_lines = 0;
  uint64_t log_lines_at_status = 0;

  Impl(const Config& c, const RunDir& r, const LaunchOptions& o)
      : cfg(c),
        run(r),
        opts(o),
        backend(tasks::resolve_backend(c.get_string("run.backend"))),
        cluster(cluster_options(c)),
        monitor(static_cast<std::size_t>(c.get_int("launch.stats_window"))) {}

  double elapsed() const { return elapsed_base + std::chrono::duration<double>(Clock::now() - t0).count(); }
  std::string bin(const std::string& rel) const {
    const std::string p = opts.binary_dir + "/" + rel;
    if (access(p.c_str(), X_OK) != 0) throw Error("launch: " + p + " is not built (run ./setup.sh)");
    return p;
  }
  std::string out_log(const std::string& role, int id) const {
    return run.sub("logs") + "/" + role + "-" + std::to_string(id) + ".out";
  }

  void plan_workers();
  void read_results();  // the evaluators' new results (replay result notes) into the monitor
  void handle_exit(const Exit& e);
  void check_hangs();
  void begin_drain(const std::string& why);
  void advance_phase();
  void save_state(const char* when);
  void save_clock();     // checkpoints/launch_state.json only (every few seconds)
  void watch_network();  // head: poll the server, feed the monitor
  bool network_done();   // head, draining: nothing left on the network, the counts settled
  void stop_network();   // head: the last account, then the Redis server (the nodes then end)
  void log_network();    // head: the closing account of the network
  Status status();
  void show(const Status& s, bool force_line);
};

void Launcher::Impl::plan_workers() {
  const std::string config = run.path() + "/config.yaml";
  const std::string name = run.shm_key();  // what the workers attach to
  const int gpus = backend == tasks::Backend::CUDA ? cuda_device_count() : 0;
  int evaluators = static_cast<int>(cfg.get_int("launch.evaluators"));
  if (evaluators == 0) evaluators = gpus > 0 ? gpus : 1;
  // A head node's evaluators are the remote ones; it runs cluster.head_evaluators itself.
  if (cluster.role == "head") evaluators = cluster.head_evaluators;
  const auto gpu_ids = visible_gpus(gpus);
  const auto cpus = allowed_cpus();
  const bool pin = cfg.get_bool("launch.cpu_affinity") && cpus.size() > 1;
  // Evaluator cores: on CPU half of them (kernels and references run there); on CUDA a few
  // per evaluator (compiles and the host side of timing). The rest: actors and learners.
  const std::size_t per_eval = evaluators == 0 ? 0
                               : backend == tasks::Backend::CPU
                                   ? std::max<std::size_t>(1, cpus.size() / 2 / evaluators)
                                   : std::max<std::size_t>(1, std::min<std::size_t>(4, cpus.size() / 2 / evaluators));
  std::size_t next = 0;
  for (int i = 0; i < evaluators; ++i) {
    WorkerSpec w;
    w.role = "evaluator";
    w.id = i;
    w.argv = {bin("evaluator/kf-evaluator"),
              "--run",
              name,
              "--config",
              config,
              "--id",
              std::to_string(i),
              "--device",
              "0",
              "--run-dir",
              run.path()};
    if (gpus > 0) w.env.push_back("CUDA_VISIBLE_DEVICES=" + gpu_ids[static_cast<std::size_t>(i) % gpu_ids.size()]);
    // Its own scratch folder: the sandbox's kf-sandbox-* folders go there, and whatever a
    // killed worker leaves is removed when this evaluator exits and at stop.
    w.env.push_back("TMPDIR=" + scratch_dir(run, "evaluator", i));
    if (pin && next + per_eval < cpus.size()) {
      w.cpus.assign(cpus.begin() + static_cast<long>(next), cpus.begin() + static_cast<long>(next + per_eval));
      next += per_eval;
      if (cfg.get_int("evaluator.cpu_threads") == 0) {
        w.argv.push_back("--set");
        w.argv.push_back("evaluator.cpu_threads=" + std::to_string(per_eval));
      }
      w.env.push_back("OMP_NUM_THREADS=" + std::to_string(per_eval));
    }
    w.log_path = out_log("evaluator", i);
    sup.add(w);
  }
  std::vector<int> rest(cpus.begin() + static_cast<long>(pin ? next : 0), cpus.end());
  // A head runs cluster.head_actors of its own (-1: actors.count); 0 leaves sampling to actor nodes.
  const int actors = cluster.local_actors(static_cast<int>(cfg.get_int("actors.count")));
  local_actors = actors;
  learner_ranks = static_cast<int>(cfg.get_int("learner.dist.ranks"));
  const int share = std::max<int>(1, static_cast<int>(rest.size()) / std::max(1, actors + learner_ranks));
  for (int i = 0; i < actors; ++i) {
    WorkerSpec w;
    w.role = "actor";
    w.id = i;
    w.argv = {bin("actors/kf-actor"), "--run",     name,      "--config", config, "--id",
              std::to_string(i),      "--run-dir", run.path()};
    if (pin) w.cpus = rest, w.env.push_back("OMP_NUM_THREADS=" + std::to_string(share));
    w.log_path = out_log("actor", i);
    sup.add(w);
  }
  // Ranks [head_ranks, learner_ranks) run on learners nodes: these meet them through the
  // Redis server and rank 0 takes their groups for them (kf-learner --remote-from).
  for (int r = 0; r < cluster.head_ranks(); ++r) {
    WorkerSpec w;
    w.role = "learner";
    w.id = r;
    w.argv = {bin("learner/kf-learner"), config, "--run", name, "--run-dir", run.path(), "--rank", std::to_string(r),
              "--final-checkpoint"};
    if (cluster.learners_split()) {
      w.argv.insert(w.argv.end(), {"--rendezvous", "redis", "--remote-from", std::to_string(cluster.head_ranks())});
      if (backend != tasks::Backend::CUDA) w.env.push_back("NCCL_NVLS_ENABLE=0");  // NCCL even on a CPU-task run
    }
    if (opts.resumed) w.argv.push_back("--resume");  // weights, optimizer, replay and kernel DB
    // A head's rank 0 joins what the network scores during the drain (advance_phase).
    if (r == 0 && cluster.role == "head") w.argv.push_back("--join-until-stopped");
    if (pin) w.cpus = rest, w.env.push_back("OMP_NUM_THREADS=" + std::to_string(share));
    if (backend == tasks::Backend::CUDA) w.env.push_back("NCCL_NVLS_ENABLE=0");
    w.log_path = out_log("learner", r);
    sup.add(w);
  }
}

void Launcher::Impl::read_results() {
  try {
    const uint64_t missed = monitor.read_results(shm->replay());
    if (missed && notes_missed == 0)
      log_warn("launch: ", missed,
               " result(s) went by before the live status read them (replay result notes "
               "overwritten); the status's verdict counts leave them out, the replay has them");
    notes_missed += missed;
  } catch (const std::exception& e) {
    log_error("launch: reading the replay's result notes failed: ", e.what(),
              "; the live status misses them, "
              "the run goes on");
  }
}

void Launcher::Impl::handle_exit(const Exit& e) {
  Worker& w = sup.workers()[e.index];
  const bool stopping_now = phase != Phase::running;
  if (w.spec.role == "evaluator") {
    try {
      const std::string dir = scratch_dir(run, "evaluator", w.spec.id);
      if (const std::size_t n = clear_dir(dir))
        log_info("launch: removed ", n, " scratch folder(s) of ", w.name(), "'s sandbox workers in ", dir);
    } catch (const std::exception& ex) {
      log_warn("launch: clearing the scratch folder of ", w.name(), " failed: ", ex.what(), "; the run goes on");
    }
  }
  if (e.ok()) {
    log_info("launch: ", w.name(), " exited normally");
    return;
  }
  // Free whatever it held mid-write or mid-read in the queues and the replay (counted as lost there).
  try {
    const std::size_t freed = shm->reap();
    if (freed) log_warn("launch: freed ", freed, " queue slots / replay groups held by dead ", w.name());
  } catch (const std::exception& ex) {
    log_error("launch: reclaiming what ", w.name(), " held failed: ", ex.what(), "; the run goes on");
  }
  if (stopping_now) {
    log_warn("launch: ", w.name(), " ", w.last_exit, " while the run stops; not restarted (log ", w.spec.log_path, ")");
    return;
  }
  if (w.spec.role == "learner" && learner_ranks > 1) {
    // The other ranks wait in a collective for this one: restarting it alone cannot
    // rejoin them. Stop the run; the last checkpoint and the saved replay are resumable.
    failed = true;
    log_error("launch: learner rank ", w.spec.id, " ", w.last_exit, " (log ", w.spec.log_path,
              "); a multi-rank learner cannot continue without it: stopping the run (resume with tools/launch "
              "--resume ",
              run.path(), ")");
    begin_drain("learner rank " + std::to_string(w.spec.id) + " died");
    return;
  }
  const int max_restarts = static_cast<int>(cfg.get_int("launch.max_restarts"));
  if (sup.schedule_restart(e.index, max_restarts, cfg.get_float("launch.restart_backoff_s"))) {
    if (w.spec.role == "learner") {
      // Continue from its last checkpoint; the shared memory still holds the live replay.
      auto& a = w.spec.argv;
      if (std::find(a.begin(), a.end(), "--resume") == a.end()) a.push_back("--resume");
      if (std::find(a.begin(), a.end(), "--keep-shm") == a.end()) a.push_back("--keep-shm");
    }
    const double wait = std::chrono::duration<double>(w.restart_at - Clock::now()).count();
    log_error("launch: ", w.name(), " ", w.last_exit, " (log ", w.spec.log_path, "); restart ", w.deaths, " of ",
              max_restarts, " in ", wait, " s");
  } else {
    failed = true;
    log_error("launch: ", w.name(), " died ", w.deaths, " times (last: ", w.last_exit, ", log ", w.spec.log_path,
              "); giving up on it and stopping the run");
    begin_drain(w.name() + " keeps dying");
  }
}

void Launcher::Impl::check_hangs() {
  const double limit = cfg.get_float("launch.hang_timeout_s");
  const auto timeout = std::chrono::milliseconds(static_cast<long long>(limit * 1000));
  const auto peers = shm->control().peers(timeout);
  monitor.counters().update(peers);
  // The learner's step is rank 0's own (counter 11: the absolute step it reached), read
  // from the live rank-0 process; summing over processes counted a restarted learner twice.
  for (const auto& p : peers)
    if (p.role == "learner" && p.id == 0 && p.alive && p.counters.size() > 11)
      learner_step = static_cast<int64_t>(p.counters[11]);
  for (const auto& p : peers) {
    const std::size_t i = sup.find_pid(p.pid);
    if (i < sup.workers().size()) sup.workers()[i].registered = true;
    // A process that has exited (its slot not yet released) is the supervisor's: reaped, not a hang.
    if (i == sup.workers().size() || p.fresh || !p.alive) continue;
    log_error("launch: ", sup.workers()[i].name(), " (pid ", p.pid, ") has not sent a heartbeat for ",
              p.heartbeat_age_ns / 1e9, " s (launch.hang_timeout_s ", limit, "); killing it, it will be restarted");
    sup.signal(i, SIGKILL);
  }
  for (std::size_t i = 0; i < sup.workers().size(); ++i) {
    const Worker& w = sup.workers()[i];
    if (!w.running() || w.registered) continue;
    const double up = std::chrono::duration<double>(Clock::now() - w.started).count();
    if (up > limit) {
      log_error("launch: ", w.name(), " (pid ", w.pid, ") has not registered with the run after ", up,
                " s; killing it, it will be restarted");
      sup.signal(i, SIGKILL);
    }
  }
}

void Launcher::Impl::begin_drain(const std::string& why) {
  if (phase != Phase::running) return;
  stop_reason = why;
  phase = Phase::draining;
  phase_since = Clock::now();
  for (auto& w : sup.workers()) w.restart_pending = false;
  shm->control().set_state(replay::RunState::draining);
  if (watch && !redis_died) {  // actor nodes stop their actors when they read it
    watch->set_run_state("draining");
    (void)watch->poll(/*now=*/true);
  }
  log_info("launch: stopping the run (", why, "): actors stop, evaluators score what is queued (up to ",
           cfg.get_float("launch.drain_timeout_s"), " s), then the learners checkpoint",
           tty ? "; Ctrl-C again stops at once" : "");
}

void Launcher::Impl::advance_phase() {
  const double in_phase = std::chrono::duration<double>(Clock::now() - phase_since).count();
  if (phase == Phase::running) {
    bool all_learners_done = true;
    for (const auto& w : sup.workers())
      if (w.spec.role == "learner" && !w.finished) all_learners_done = false;
    // On a head, learner rank 0 stays after its last step, joining what the network still
    // scores into the head's replay until the run stops: its last step starts the drain.
    const int64_t steps = cfg.get_int("learner.steps");
    if (all_learners_done || (watch && steps > 0 && learner_step >= steps))
      begin_drain("the learner reached learner.steps");
    const double budget = cfg.get_float("launch.max_minutes") * 60;
    if (budget > 0 && elapsed() >= budget) begin_drain("launch.max_minutes reached");
    return;
  }
  if (phase == Phase::draining) {
    const double limit = cfg.get_float("launch.drain_timeout_s");
    // On a head, evaluators of other nodes score what is on the network too and actor nodes
    // stop their actors; after the drain's SIGKILL the rest stays counted queued or in flight.
    const bool remote_done = !watch || escalation >= 2 || network_done();
    const bool drained = sup.running("actor") == 0 && sup.running("evaluator") == 0 && remote_done;
    if (!drained && in_phase > limit && escalation == 0) {
      escalation = 1;
      log_warn("launch: actors/evaluators still running ", limit, " s after the drain began; sending SIGTERM");
      sup.signal_role("actor", SIGTERM);
      sup.signal_role("evaluator", SIGTERM);
    }
    if (!drained && in_phase > limit + 15 && escalation == 1) {
      escalation = 2;
      log_error("launch: actors/evaluators ignored SIGTERM for 15 s; killing them");
      sup.signal_role("actor", SIGKILL);
      sup.signal_role("evaluator", SIGKILL);
    }
    if (drained) {
      phase = Phase::stopping;
      phase_since = Clock::now();
      escalation = 0;
      shm->control().set_state(replay::RunState::stopped);
      log_info("launch: actors and evaluators stopped; learners take their final checkpoint");
    }
    return;
  }
  if (phase == Phase::stopping) {
    const double limit = cfg.get_float("launch.stop_timeout_s");
    if (sup.running() == 0) {
      phase = Phase::done;
      return;
    }
    if (in_phase > limit && escalation == 0) {
      escalation = 1;
      log_error("launch: learners still running ", limit, " s after the stop; sending SIGTERM");
      sup.signal_role("", SIGTERM);
    }
    if (in_phase > limit + 30 && escalation == 1) {
      escalation = 2;
      log_error("launch: learners ignored SIGTERM for 30 s; killing them (the previous checkpoint stays)");
      sup.signal_role("", SIGKILL);
    }
  }
}

void Launcher::Impl::watch_network() {
  if (!watch || redis_died || network_stopped) return;
  (void)watch->poll();
  const NetworkAccount a = watch->account();
  if (a.read) monitor.set_network_counts(a.created, a.scored);
  monitor.merge_node_seconds(watch->node_seconds());
}

bool Launcher::Impl::network_done() {
  if (redis_died) return true;  // nothing comes back through a dead server
  if (sup.running("actor") > 0 || sup.running("evaluator") > 0) return false;
  const NetworkAccount a = watch->account();  // watch_network polls it every 250 ms
  // Actor nodes stop their actors when they read the state (within a second); what those
  // publish before they exit is scored like the rest.
  if (watch->actor_nodes_running() > 0 || !a.read || a.queued + a.in_flight > 0) {
    network_idle_since = {};
    return false;
  }
  // The processes' counts reach the server up to a second late, the evaluator nodes'
  // reports up to half a second after their verdict lines: wait up to 3 s until the
  // account adds up and the reports cover every result.
  if (network_idle_since == Clock::time_point{}) network_idle_since = Clock::now();
  const uint64_t verdicts =
      watch->reported_verdicts() + monitor.counters().sum("evaluator", replay::counter::kEvalScored);
  // A live learner rank 0 joins kf:groups and kf:results into the head's replay: wait for it.
  const bool joined = sup.running("learner") == 0 || a.results_waiting + a.groups_waiting == 0;
  return (a.balanced() && verdicts >= a.scored && joined) ||
         Clock::now() - network_idle_since > std::chrono::seconds(3);
}

void Launcher::Impl::stop_network() {
  if (watch && !redis_died && !network_stopped) {
    (void)watch->poll(/*now=*/true);  // the last figures, before the server goes
    watch_network();
  }
  network_stopped = true;
  if (redis) {
    redis->stop();
    redis.reset();
    log_info("launch: the Redis server stopped; evaluator and actor nodes end after cluster.redis.gone_after_s (",
             cfg.get_float("cluster.redis.gone_after_s"), " s)");
  }
}

// The network's closing line: what went through the head's server, beside the candidate
// account (log_ledger).
void Launcher::Impl::log_network() {
  if (!watch) return;
  const NetworkAccount a = watch->account();
  log_info("launch: network: ", a.groups_published, " group(s) and ", a.created,
           " candidate(s) published to the head's server, ", a.scored, " result(s) sent back by evaluators (",
           a.claimed_again, " candidate(s) claimed from a dead or stalled evaluator, ", a.results_late,
           " late result(s) dropped), ", a.dead, " dead-lettered, ", a.dropped, " dropped, ", a.queued, " queued, ",
           a.in_flight, " in flight; the head's replay opened ", a.groups_opened, " group(s) (", a.groups_dropped,
           " dropped, ", a.groups_duplicate, " duplicate) and joined ", a.results_joined, " result(s) (",
           a.results_orphan, " orphan, ", a.results_duplicate, " duplicate result(s) dropped) and marked ",
           a.members_lost, " unsent member(s) lost; ", a.results_waiting, " result(s) and ", a.groups_waiting,
           " group(s) left unjoined; ", a.undecodable, " undecodable record(s), ", watch->errors(),
           " redis error(s) reading the server", redis_died ? " (the server died: these are its last figures)" : "");
}

void Launcher::Impl::save_state(const char* when) {
  try {
    save_run_outputs(*shm, run, backend);
    const bool closed = std::string(when) == "end of run";
    save_launch_state(
        run, monitor, elapsed(), when, shm->snapshots().latest().version,
        watch ? nlohmann::json{{"network_session", account_json(watch->account(), closed)}} : nlohmann::json::object());
  } catch (const std::exception& e) {
    log_error("launch: saving the run's outputs (", when, ") failed: ", e.what(), "; the run goes on");
  }
}

void Launcher::Impl::save_clock() {
  try {
    save_launch_state(
        run, monitor, elapsed(), "periodic", shm->snapshots().latest().version,
        watch ? nlohmann::json{{"network_session", account_json(watch->account(), false)}} : nlohmann::json::object());
  } catch (const std::exception& e) {
    log_error("launch: saving the launcher's clock and totals failed: ", e.what(), "; the run goes on");
  }
}

Status Launcher::Impl::status() {
  Status s;
  s.phase = phase_name(phase);
  s.elapsed_s = elapsed();
  s.step = learner_step;
  s.step_budget = cfg.get_int("learner.steps");
  s.time_budget_s = cfg.get_float("launch.max_minutes") * 60;
  watch_network();
  monitor.sample_rates(s.elapsed_s, s);
  const auto rp = shm->replay().stats();
  s.candidate_queue = shm->candidate_ledger().queued;
  s.ready_groups = rp.ready_now;
  s.open_groups = rp.open_now;
  s.policy_version = shm->snapshots().latest().version;
  s.gpu_busy = gpu.busy();
  if (const auto probe = shm->control().rendezvous_get("probe", std::chrono::nanoseconds(0)))
    apply_probe_brief(*probe, s);
  if (watch) {
    const NetworkAccount a = watch->account();
    s.candidate_queue = a.queued;  // the head's shared-memory queue is not used
    s.workers.push_back(std::string("network: ") + (redis_died ? "server died, last figures: " : "") +
                        std::to_string(a.queued) + " queued, " + std::to_string(a.in_flight) + " in flight, " +
                        std::to_string(a.results_waiting) + " results and " + std::to_string(a.groups_waiting) +
                        " groups for the learner, " + std::to_string(a.dead) + " dead-lettered");
    if (local_actors == 0 || watch->actor_nodes_seen())
      s.workers.push_back(std::string("actor nodes: ") +
                          (watch->actor_nodes_seen() ? std::to_string(watch->actor_nodes_running()) + " running"
                                                     : "none connected yet"));
  }
  for (const auto& w : sup.workers()) {
    std::string st = w.running()         ? "up"
                     : w.restart_pending ? "restarting"
                     : w.given_up        ? "gave up"
                     : w.finished        ? "done"
                                         : "down";
    if (w.deaths) st += " (" + std::to_string(w.deaths) + " restarts)";
    s.workers.push_back(w.name() + " " + st);
  }
  return s;
}

void Launcher::Impl::show(const Status& s, bool line) {
  if (!tty || line) {
    log_info(render_status_line(s));
    return;
  }
  const std::string text = render_status(s);
  std::string out;
  // Redraw in place unless a log line came in between (then start below it).
  if (status_lines > 0 && log_line_count() == log_lines_at_status) out += "\033[" + std::to_string(status_lines) + "F";
  for (std::size_t a = 0, b; a < text.size(); a = b + 1) {
    b = text.find('\n', a);
    out += text.substr(a, b - a) + "\033[K\n";
  }
  std::fputs(out.c_str(), stdout);
  std::fflush(stdout);
  status_lines = static_cast<int>(std::count(text.begin(), text.end(), '\n'));
  log_lines_at_status = log_line_count();
}

// The candidate queue's exact account: created = scored + lost + queued + in flight.
static void log_ledger(const replay::QueueLedger& l, const char* whose) {
  log_info("launch: candidates of ", whose, ": created ", l.created, " = scored ", l.scored, " + lost ", l.lost(),
           " (evaluator died ", l.lost_consumer, ", actor died ", l.lost_producer, ", dropped ", l.dropped,
           ", corrupt ", l.corrupt, ", launcher died ", l.lost_run_died, ") + queued ", l.queued, " + in flight ",
           l.in_flight, "; re-queued (given back by a stopping evaluator, or reclaimed from a dead one) ", l.requeued,
           l.balanced() ? "" : " (does not add up: a bug)");
}

// The same account on a head, where every candidate passed the head's server (cluster.h,
// NetworkAccount). `gone`: the server is gone (it died, or the launcher that ran it did):
// what it still held is lost with it, nothing is queued or in flight any more.
static void log_network_ledger(const NetworkAccount& a, const char* whose, const char* gone) {
  uint64_t with_server = 0, queued = a.queued, in_flight = a.in_flight;
  bool adds_up = a.balanced();
  if (gone) {
    const uint64_t settled = a.scored + a.lost();
    with_server = a.created > settled ? a.created - settled : 0;
    adds_up = a.created >= settled;
    queued = in_flight = 0;
  }
  log_info("launch: candidates of ", whose, ": created ", a.created, " = scored ", a.scored, " + lost ",
           a.lost() + with_server, " (dead-lettered ", a.dead, ", dropped ", a.dropped, gone ? ", " : "",
           gone ? gone : "", gone ? " " + std::to_string(with_server) : std::string(), ") + queued ", queued,
           " + in flight ", in_flight, "; through the head's server, as its processes counted them",
           adds_up ? "" : " (does not add up: a process's last counts are missing, or a bug)");
}

Launcher::Launcher(const Config& cfg, const RunDir& run, const LaunchOptions& opts)
    : impl_(std::make_unique<Impl>(cfg, run, opts)) {
  Impl& m = *impl_;
  // Shared memory a launcher of this run left when it died: the candidates still queued
  // or in an evaluator's hands there are counted lost, one log line each (their groups
  // died with it), then it is removed (a live one makes RunShm::create refuse).
  if (replay::RunShm::probe(run.shm_key()) == replay::SegmentState::Stale) {
    try {
      const replay::Salvage sv = replay::salvage_or_count(run.shm_key(), run.path());
      // A head's candidates went through its server, which died with it: its account is
      // the one it last saved (the counts of its last few seconds are not in it).
      const auto saved = read_launch_state(run).value("network_session", nlohmann::json());
      if (m.cluster.role == "head" && saved.is_object() && !saved.value("closed", true)) {
        NetworkAccount a;
        a.created = saved.value("created", uint64_t{0});
        a.scored = saved.value("scored", uint64_t{0});
        a.dead = saved.value("dead", uint64_t{0});
        a.dropped = saved.value("dropped", uint64_t{0});
        log_network_ledger(a, "the dead launcher's session", "launcher died");
      }
      if (sv.found && (m.cluster.role != "head" || sv.ledger.created > 0))
        log_ledger(sv.ledger, "the dead launcher's session");
    } catch (const std::exception& e) {
      log_warn("launch: run ", run.name(), ": could not count the candidates its dead launcher left: ", e.what());
    }
    const auto removed = remove_dead_run_shm(run.shm_key(), /*lock_too=*/false);
    std::string list;
    for (const auto& p : removed) list += (list.empty() ? "" : ", ") + p;
    log_warn("launch: run ", run.name(), ": removed the shared memory its dead launcher left (", list, ")");
  }
  if (scratch_root(run).rfind(run.path(), 0) != 0)
    log_warn("launch: a folder above ", run.path(),
             " is not searchable by others (o+x), which the sandbox "
             "workers (user nobody) need; their scratch folders go to ",
             scratch_root(run), " instead");
  if (const std::size_t n = clear_scratch(run))
    log_warn("launch: removed ", n, " scratch folder(s) of sandbox workers left by an earlier launcher of this run");
  m.plan_workers();  // checks the binaries before shared memory exists
  m.shm = replay::RunShm::create(run.shm_key(), replay::run_shm_config(cfg));
  if (m.cluster.role == "head") {
    m.redis = std::make_unique<HeadServer>(m.cluster, run);
    log_info("launch: head node ", m.cluster.node_name, ": ", m.redis->where(), " (user kf, password from $",
             m.cluster.password_env, "); evaluator nodes connect to ", m.cluster.host, ":", m.cluster.port);
    m.watch = std::make_unique<ClusterWatch>(m.cluster);
    m.watch->set_run_state("running");
    (void)m.watch->poll(/*now=*/true);
    if (m.local_actors == 0)
      log_info(
          "launch: the head runs no actor of its own (cluster.head_actors 0): every group comes from actor "
          "nodes; the run stops if none connects within cluster.redis.gone_after_s (",
          m.cluster.gone_after.count() / 1000.0, " s)");
  }
  if (opts.resumed) {
    m.elapsed_base = load_launch_state(run, m.monitor);
    // kernels/kernel_db.json may be newer than the checkpoint the learner resumes from:
    // merge it now, so the learner's restore adds to it and no later save drops an entry.
    merge_saved_kernels(*m.shm, run);
  }
  m.metrics = std::make_unique<MetricsWriter>(run.sub("metrics"), "run");
}

Launcher::~Launcher() = default;

int Launcher::run() {
  Impl& m = *impl_;
  auto& ctl = m.shm->control();
  log_info("launch: backend ", tasks::backend_name(m.backend), ", ", m.sup.workers().size(), " workers; logs in ",
           m.run.sub("logs"), ", metrics in ", m.run.sub("metrics"));
  for (std::size_t i = 0; i < m.sup.workers().size(); ++i) {
    m.sup.start(i);
    const auto& w = m.sup.workers()[i];
    std::string cpus;
    for (int c : w.spec.cpus) cpus += (cpus.empty() ? "" : ",") + std::to_string(c);
    log_info("launch: started ", w.name(), " pid ", w.pid, cpus.empty() ? "" : " on CPUs " + cpus);
  }
  ctl.set_state(replay::RunState::running);

  const double status_every = m.tty ? 1.0 : m.cfg.get_float("launch.status_every_s");
  const double metrics_every = m.cfg.get_float("launch.metrics_every_s");
  auto next_status = Clock::now(), next_metrics = Clock::now() + std::chrono::milliseconds(500);
  auto next_check = Clock::now();
  int signals_handled = 0;
  while (m.phase != Phase::done) {
    m.shm->heartbeat();
    const int sig = m.opts.signals ? m.opts.signals->load() : 0;
    if (sig > signals_handled) {
      signals_handled = sig;
      if (sig >= 2 || m.phase != Phase::running) {
        log_error("launch: second stop signal: killing every worker now (checkpoints already written stay)");
        m.sup.signal_role("", SIGKILL);
        m.sup.wait_role("", 5s, nullptr);
        m.stop_network();
        m.save_clock();
        m.shm->shutdown();
        try {
          log_info("launch: removed ", clear_scratch(m.run), " scratch folder(s) of sandbox workers");
        } catch (const std::exception&) {
        }
        return 130;
      }
      m.begin_drain("stop signal");
    }
    for (const auto& e : m.sup.reap()) m.handle_exit(e);
    for (std::size_t i : m.sup.start_due())
      log_info("launch: restarted ", m.sup.workers()[i].name(), " as pid ", m.sup.workers()[i].pid);
    m.read_results();
    m.watch_network();  // a head: at most every 250 ms
    const auto now = Clock::now();
    if (now >= next_check) {
      m.check_hangs();
      if (m.redis && !m.redis_died && !m.redis->alive()) {
        log_error("launch: the Redis server (", m.redis->where(), ") died; log ", m.run.sub("redis"), "/redis.log; ",
                  m.phase == Phase::running ? "stopping the run" : "the run was stopping already",
                  " (what it held is counted lost with it; resume with tools/launch --resume ", m.run.path(),
                  " on every node, which starts a fresh server)");
        // Nothing comes back through a dead server: the drain does not wait for the network.
        m.redis_died = true;
        if (m.phase == Phase::running) {
          m.failed = true;
          m.begin_drain("the Redis server died");
        }
      }
      // A head that runs no actor of its own needs an actor node: without one nothing samples.
      if (m.watch && m.local_actors == 0 && m.phase == Phase::running && !m.watch->actor_nodes_seen() &&
          now - m.t0 > m.cluster.gone_after) {
        log_error("launch: cluster.head_actors is 0 and no actor node has connected to ", m.cluster.host, ":",
                  m.cluster.port, " within cluster.redis.gone_after_s (", m.cluster.gone_after.count() / 1000.0,
                  " s): nothing samples; stopping the run (start nodes with cluster.role actors, or let the head run "
                  "actors: cluster.head_actors -1 or more)");
        m.failed = true;
        m.begin_drain("no actor node connected");
      }
      next_check = now + 1s;
      const uint64_t ckpts = m.monitor.counters().sum("learner", 7);
      if (ckpts > m.checkpoints_seen) {
        m.checkpoints_seen = ckpts;
        m.save_state("learner checkpoint");
        m.next_state_save = now + 5s;
      } else if (now >= m.next_state_save) {
        m.save_clock();  // the clock and totals survive a crash of this launcher
        m.next_state_save = now + 5s;
      }
    }
    if (now >= next_status || now >= next_metrics) {
      const Status s = m.status();
      if (now >= next_status) {
        m.show(s, false);
        next_status = now + std::chrono::milliseconds(static_cast<long long>(status_every * 1000));
      }
      if (now >= next_metrics) {
        try {
          m.metrics->write(s.step, status_scalars(s), {{"phase", s.phase}, {"verdicts", s.results.verdicts}});
        } catch (const std::exception& e) {
          log_error("launch: metrics write failed: ", e.what(), "; the run goes on");
        }
        next_metrics = now + std::chrono::milliseconds(static_cast<long long>(metrics_every * 1000));
      }
    }
    m.advance_phase();
    std::this_thread::sleep_for(100ms);
  }
  // Every worker is gone: the last results, then the outputs.
  m.stop_network();
  m.read_results();
  m.check_hangs();  // final counter read
  const Status s = m.status();
  m.show(s, true);
  try {
    m.metrics->write(s.step, status_scalars(s), {{"phase", "done"}, {"verdicts", s.results.verdicts}});
  } catch (const std::exception&) {
  }
  m.save_state("end of run");
  if (m.watch) {
    m.log_network();
    log_network_ledger(m.watch->account(), "this session", m.redis_died ? "server died" : nullptr);
  } else {
    log_ledger(m.shm->candidate_ledger(), "this session");
  }
  m.shm->shutdown();
  try {
    const std::size_t n = clear_scratch(m.run);
    log_info("launch: removed ", n, " scratch folder(s) left by sandbox workers under ", scratch_root(m.run));
  } catch (const std::exception& e) {
    log_warn("launch: clearing the scratch folders failed: ", e.what());
  }
  bool learner_failed = false;
  for (const auto& w : m.sup.workers())
    if (w.spec.role == "learner" && !w.finished) learner_failed = true;
  if (learner_failed) {
    log_error("launch: a learner rank did not finish cleanly; the newest checkpoint in ", m.run.sub("checkpoints"),
              " is what --resume continues from");
    m.failed = true;
  }
  log_info("launch: run ", m.run.name(), m.failed ? " stopped after a failure (" : " finished (", m.stop_reason,
           "); outputs in ", m.run.path(), ", continue with tools/launch --resume ", m.run.path());
  return m.failed ? 1 : 0;
}

}  // namespace kf::launch
