// kf-launch: the run supervisor behind tools/launch.
//   tools/launch CONFIG [--set key=value]... [--name NAME]
//   tools/launch --resume RUN [--set key=value]...
//   tools/launch CONFIG --check        validate only
//   tools/launch --clean RUN           remove what a dead launcher of RUN left (shared
//                                      memory, sandbox scratch folders); refuses while it runs
//   tools/launch CONFIG --slurm [--print-srun]   inside a Slurm allocation: execs (or prints)
//                                      the srun line that starts one launcher per node; each
//                                      of those maps SLURM_NODEID to cluster.role (node 0 head)
// Several nodes (cluster.h): every worker of every node moves its work through the head's
// Redis server; a node's launcher only supervises. cluster.role evaluators: no shared
// memory; N `kf-evaluator --remote` processes take candidates from the head's server
// (run_evaluator_node), in the run folder <run.root>/<run.name>.<node name>. cluster.role
// learners: learner ranks that meet the head's over NCCL and get their groups from its
// rank 0 (run_learner_node); the launcher's logs in <run.root>/<run.name>.<node name>,
// checkpoints in the head's folder. cluster.role actors: actors that publish their groups to
// the head's server, on this node's run shared memory for the weights and kernels they
// mirror (run_actor_node), logs and actor metrics in <run.root>/<run.name>.<node name>.
// Validates the config and the task selection before anything starts, creates the run
// directory and the run's shared memory, spawns the evaluators (one per GPU, pinned),
// the actors and the learner ranks (evaluators write results into the replay themselves;
// the launcher counts them for the status from the replay's result notes), restarts dead or hung workers with
// back-off, and stops the run in order: actors stop, evaluators drain the queue, the
// learners take a final checkpoint, then the replay, kernel database, best kernels and
// the launcher's own counters are saved. launch.mode: serial runs the same pipeline in
// this one process instead (kf::launch::run_serial).
// --resume first checks the run's checkpoints: with no valid one it exits 2 naming each
// folder and why it is unusable, and creates or changes nothing.
// Exit: 0 finished or stopped cleanly, 1 the run failed (a worker kept dying; --clean: the
// launcher is alive), 2 bad config or arguments (nothing started), 130 a second Ctrl-C.
#include <signal.h>
#include <unistd.h>

#include "kf/common/cli.h"
#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <atomic>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "actor_nodes.h"
#include "cluster.h"
#include "kf/common/config.h"
#include "kf/common/error.h"
#include "kf/common/log.h"
#include "kf/common/run_dir.h"
#include "kf/launch/launcher.h"
#include "kf/learner/learner.h"
#include "launch_common.h"

namespace {
std::atomic<int> g_signals{0};
void on_signal(int) { g_signals.fetch_add(1); }

bool is_dir(const std::string& p) { return access((p + "/config.yaml").c_str(), R_OK) == 0; }

std::string base_name(std::string p) {
  while (p.size() > 1 && p.back() == '/') p.pop_back();
  const auto slash = p.find_last_of('/');
  return slash == std::string::npos ? p : p.substr(slash + 1);
}

// tools/launch --clean RUN: the run's shared memory and sandbox scratch folders, when its
// launcher is gone.
int clean_run(const std::string& arg) {
  const std::string folder = is_dir(arg) ? arg : "runs/" + arg;
  const std::string name = base_name(arg);
  try {
    kf::launch::check_run_name(name, "--clean");
    // The shared memory is named after the folder's path (RunDir::shm_key), so the folder
    // must be there.
    if (!is_dir(folder))
      throw kf::Error(
          folder + ": not a run folder (no config.yaml); --clean takes a run folder, or the name of one under runs/");
    const kf::RunDir run = kf::RunDir::open(folder);
    const auto removed = kf::launch::remove_dead_run_shm(run.shm_key(), /*lock_too=*/true);
    const std::size_t scratch = kf::launch::clear_scratch(run);
    std::string list;
    for (const auto& p : removed) list += "\n  " + p;
    if (removed.empty() && scratch == 0)
      std::printf("run %s: nothing to clean (no shared memory, no scratch folders)\n", name.c_str());
    else
      std::printf("run %s: removed %zu shared-memory file(s)%s\nand %zu sandbox scratch folder(s)%s\n", name.c_str(),
                  removed.size(), list.c_str(), scratch, (" under " + kf::launch::scratch_root(run)).c_str());
    return 0;
  } catch (const std::exception& e) {
    kf::log_error("--clean ", arg, ": ", e.what(), "; nothing was removed");
    return 1;
  }
}

// --resume: the newest valid checkpoint, or an error naming every folder and why it is unusable.
void check_resumable(const std::string& run_path) {
  const std::string dir = run_path + "/checkpoints";
  const auto checks = kf::learner::check_checkpoints(dir);
  std::string found;
  for (const auto& c : checks) {
    if (c.error.empty()) {
      if (!found.empty())
        kf::log_warn("resume: newer checkpoint(s) are unusable and will be renamed <name>.corrupt-<time>:", found,
                     "; continuing from ", c.path, " (the newer kernels/ and best/ are kept and merged)");
      return;
    }
    found += "\n  " + c.path + ": " + c.error;
  }
  throw kf::Error("--resume " + run_path + ": no valid checkpoint in " + dir +
                  (checks.empty() ? std::string(" (none was written; start the run again with tools/launch CONFIG)")
                                  : ":" + found));
}
}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"KernelForge launcher: runs a training cluster (docs/operations.md)"};
  std::string config_file, resume, name;
  std::vector<std::string> sets;
  app.add_option("config", config_file, "YAML config (see configs/); not with --resume");
  app.add_option("--resume", resume, "continue a run: its folder, or its name under run.root (runs/)");
  app.add_option("--set", sets, "override a key: a.b=value (repeatable)");
  app.add_option("--name", name, "run name (overrides run.name)");
  bool check_only = false;
  app.add_flag("--check", check_only, "validate the config and task selection, start nothing, exit 0 or 2");
  std::string clean;
  app.add_option("--clean", clean, "remove the shared memory and scratch folders a dead launcher of RUN left");
  bool slurm = false, print_srun = false;
  app.add_flag("--slurm", slurm, "inside a Slurm allocation: one launcher per node (node 0 head, the rest evaluators)");
  app.add_flag("--print-srun", print_srun, "with --slurm: print the srun line instead of running it");
  KF_CLI_PARSE(app, argc, argv);
  kf::log_init("launch", 0);
  if (!clean.empty()) {
    if (!config_file.empty() || !resume.empty()) {
      kf::log_error("--clean RUN takes no CONFIG and no --resume; nothing was removed");
      return 2;
    }
    return clean_run(clean);
  }
  if (config_file.empty() == resume.empty()) {
    kf::log_error(
        "give a CONFIG to start a run, or --resume RUN to continue one (not both: a resumed run keeps its "
        "config.yaml; change keys with --set); nothing was started");
    return 2;
  }

  // --- the config, and everything checkable before a process or a file is made
  kf::Config cfg;
  std::string run_path;
  try {
    if (!resume.empty()) {
      run_path = is_dir(resume) ? resume : "runs/" + resume;
      if (!is_dir(run_path))
        throw kf::Error("--resume " + resume + ": no run folder with a config.yaml at " + resume + " or " + run_path);
      config_file = run_path + "/config.yaml";
    }
    if (!name.empty()) sets.push_back("run.name=" + name);
    cfg = kf::Config::load(config_file, sets);
    if (cfg.file_keys() == 0)
      throw kf::Error(config_file + ": the config sets no keys (an empty file); start from configs/default.yaml");
    if (slurm) {
      const auto plan = kf::launch::slurm_plan(
          [](const std::string& k) {
            const char* v = std::getenv(k.c_str());
            return std::string(v ? v : "");
          },
          cfg.get_strings("cluster.nodes"));
      if (!plan.in_step) {
        // The batch script's launcher: one launcher per node through srun. Every node
        // needs the same Redis password: made here when the environment has none.
        const std::string pw_env = cfg.get_string("cluster.redis.password_env");
        if (print_srun && plan.nodes > 1 && !std::getenv(pw_env.c_str()))
          kf::log_warn("--slurm: $", pw_env, " is unset: export the same Redis password before running this line");
        if (!print_srun && plan.nodes > 1 && !pw_env.empty() && !std::getenv(pw_env.c_str())) {
          std::string pw;
          std::ifstream rnd("/dev/urandom", std::ios::binary);
          for (int i = 0; i < 24 && rnd; ++i)
            pw += "0123456789abcdefghijklmnopqrstuvwxyz"[static_cast<unsigned char>(rnd.get()) % 36];
          if (pw.size() != 24) throw kf::Error("--slurm: cannot read /dev/urandom for the Redis password");
          setenv(pw_env.c_str(), pw.c_str(), 1);
          kf::log_info("--slurm: made a Redis password in $", pw_env, " for this job's nodes");
        }
        std::vector<std::string> self = {kf::launch::binary_dir(argv[0]) + "/launch/kf-launch"};
        for (int i = 1; i < argc; ++i)
          if (std::string(argv[i]) != "--print-srun") self.push_back(argv[i]);
        const auto line = kf::launch::srun_argv(plan, self);
        std::string text;
        for (const auto& a : line) text += (text.empty() ? "" : " ") + a;
        if (print_srun) {
          std::printf("%s\n", text.c_str());
          return 0;
        }
        kf::log_info("--slurm: job ", plan.job_id, ", ", plan.nodes, " node(s), head ", plan.head_host, ": ", text);
        std::vector<char*> av;
        for (auto& a : const_cast<std::vector<std::string>&>(line)) av.push_back(a.data());
        av.push_back(nullptr);
        execvp("srun", av.data());
        throw kf::Error(std::string("--slurm: cannot run srun: ") + std::strerror(errno) +
                        " (is Slurm's srun on PATH?)");
      }
      kf::log_info("--slurm: job ", plan.job_id, " node ", plan.node_id, " of ", plan.nodes, " (",
                   plan.hosts[static_cast<std::size_t>(plan.node_id)], "): role ", plan.role, ", head ",
                   plan.head_host);
      sets.insert(sets.end(), plan.sets.begin(), plan.sets.end());
      cfg = kf::Config::load(config_file, sets);
      kf::launch::check_head_actors(cfg, plan.roles);  // the allocation's roles: is there an actor node?
    }
    if (cfg.get_string("cluster.role") == "evaluators") {
      kf::launch::preflight_evaluator_node(cfg);
    } else if (cfg.get_string("cluster.role") == "learners") {
      kf::launch::preflight_learner_node(cfg);
    } else if (cfg.get_string("cluster.role") == "actors") {
      kf::launch::preflight_actor_node(cfg);
    } else {
      kf::launch::preflight(cfg);
      if (!resume.empty()) check_resumable(run_path);
    }
    if (check_only) {
      kf::log_info("config ", config_file, " is valid: nothing started (--check)");
      return 0;
    }
  } catch (const std::exception& e) {
    kf::log_error("config rejected: ", e.what(), "; nothing was started");
    return 2;
  }

  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  signal(SIGPIPE, SIG_IGN);

  try {
    const bool learner_node = cfg.get_string("cluster.role") == "learners";
    const bool actor_node = cfg.get_string("cluster.role") == "actors";
    const bool evaluator_node = cfg.get_string("cluster.role") == "evaluators" || learner_node || actor_node;
    // An evaluator (or learners) node keeps its logs in a folder of its own beside the head's run.
    // An actor node's folder names its shared memory: a restarted node takes the same one,
    // so it finds (and removes) what its killed launcher left there.
    const std::string node_dir = cfg.get_string("run.root") + "/" + cfg.get_string("run.name") + "." +
                                 kf::launch::cluster_options(cfg).node_name;
    kf::RunDir run =
        actor_node && is_dir(node_dir) ? kf::RunDir::open(node_dir)
        : evaluator_node
            ? kf::RunDir::create(cfg.get_string("run.root"),
                                 cfg.get_string("run.name") + "." + kf::launch::cluster_options(cfg).node_name)
        : resume.empty() ? kf::RunDir::create(cfg.get_string("run.root"), cfg.get_string("run.name"))
                         : kf::RunDir::open(run_path);
    // The snapshot names the run as it is on disk (a taken name got a -2 suffix).
    if (!evaluator_node) sets.push_back("run.name=" + run.name());
    cfg = kf::Config::load(config_file, sets);
    kf::write_file_atomic(run.path() + "/config.yaml", cfg.to_yaml());  // on resume: --set changes persist
    kf::log_init("launch", 0, run.log_file("launch", 0));
    const auto level = cfg.get_string("run.log_level");
    kf::log_set_level(level == "debug"   ? kf::LogLevel::Debug
                      : level == "warn"  ? kf::LogLevel::Warn
                      : level == "error" ? kf::LogLevel::Error
                                         : kf::LogLevel::Info);
    kf::log_info(resume.empty() ? "new run " : "resuming run ", run.path(), " (", config_file, ")");
    kf::launch::LaunchOptions lo;
    lo.binary_dir = kf::launch::binary_dir(argv[0]);
    lo.resumed = !resume.empty();
    lo.signals = &g_signals;
    if (learner_node) return kf::launch::run_learner_node(cfg, run, lo.binary_dir, lo.resumed, &g_signals);
    if (actor_node) {
      return kf::launch::run_actor_node(cfg, run, run.path() + "/config.yaml", lo.binary_dir, &g_signals);
    }
    if (evaluator_node) return kf::launch::run_evaluator_node(cfg, run, lo.binary_dir, &g_signals);
    if (cfg.get_string("launch.mode") == "serial") return kf::launch::run_serial(cfg, run, lo);
    kf::launch::Launcher launcher(cfg, run, lo);
    return launcher.run();
  } catch (const std::exception& e) {
    kf::log_error("launch failed: ", e.what(), "; stopping (the run folder keeps what was saved)");
    return 1;
  }
}
