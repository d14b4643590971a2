// kf-launch: the run supervisor behind tools/launch.
//   tools/launch CONFIG [--set key=value]... [--name NAME]
//   tools/launch --resume RUN [--set key=value]...
//   tools/launch CONFIG --check        validate only
// Validates the config and the task selection before anything starts, creates the run
// directory and the run's shared memory, spawns the evaluators (one per GPU, pinned),
// the actors and the learner ranks, moves results from the result queue into the
// replay (and counts them for the status), restarts dead or hung workers with
// back-off, and stops the run in order: actors stop, evaluators drain the queue, the
// learners take a final checkpoint, then the replay, kernel database, best kernels and
// the launcher's own counters are saved. launch.mode: serial runs the same pipeline in
// this one process instead (kf::launch::run_serial).
// Exit: 0 finished or stopped cleanly, 1 the run failed (a worker kept dying), 2 bad
// config or arguments (nothing started), 130 a second Ctrl-C (stopped at once).
#include <signal.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "kf/common/config.h"
#include "kf/common/error.h"
#include "kf/common/log.h"
#include "kf/common/run_dir.h"
#include "launcher.h"

namespace {
std::atomic<int> g_signals{0};
void on_signal(int) { g_signals.fetch_add(1); }

bool is_dir(const std::string& p) { return access((p + "/config.yaml").c_str(), R_OK) == 0; }
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
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  kf::log_init("launch", 0);
  if (config_file.empty() == resume.empty()) {
    kf::log_error("give a CONFIG to start a run, or --resume RUN to continue one (not both: a resumed run keeps its "
                  "config.yaml; change keys with --set); nothing was started");
    return 2;
  }

  // --- the config, and everything checkable before a process or a file is made
  kf::Config cfg;
  std::string run_path;
  try {
    if (!resume.empty()) {
      run_path = is_dir(resume) ? resume : "runs/" + resume;
      if (!is_dir(run_path)) throw kf::Error("--resume " + resume + ": no run folder with a config.yaml at " + resume +
                                             " or " + run_path);
      config_file = run_path + "/config.yaml";
    }
    if (!name.empty()) sets.push_back("run.name=" + name);
    cfg = kf::Config::load(config_file, sets);
    kf::launch::preflight(cfg);
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
    kf::RunDir run = resume.empty() ? kf::RunDir::create(cfg.get_string("run.root"), cfg.get_string("run.name"))
                                    : kf::RunDir::open(run_path);
    // The snapshot names the run as it is on disk (a taken name got a -2 suffix).
    sets.push_back("run.name=" + run.name());
    cfg = kf::Config::load(config_file, sets);
    kf::write_file_atomic(run.path() + "/config.yaml", cfg.to_yaml());  // on resume: --set changes persist
    kf::log_init("launch", 0, run.log_file("launch", 0));
    const auto level = cfg.get_string("run.log_level");
    kf::log_set_level(level == "debug" ? kf::LogLevel::Debug : level == "warn" ? kf::LogLevel::Warn
                      : level == "error" ? kf::LogLevel::Error : kf::LogLevel::Info);
    kf::log_info(resume.empty() ? "new run " : "resuming run ", run.path(), " (", config_file, ")");
    kf::launch::LaunchOptions lo;
    lo.binary_dir = kf::launch::binary_dir(argv[0]);
    lo.resumed = !resume.empty();
    lo.signals = &g_signals;
    if (cfg.get_string("launch.mode") == "serial") return kf::launch::run_serial(cfg, run, lo);
    kf::launch::Launcher launcher(cfg, run, lo);
    return launcher.run();
  } catch (const std::exception& e) {
    kf::log_error("launch failed: ", e.what(), "; stopping (the run folder keeps what was saved)");
    return 1;
  }
}
