// kf-launch: the run supervisor (tools/launch). Today it does what the foundation has:
// validates the config, creates the run directory with the resolved config snapshot and
// per-process logs, loads the task suite and runs every reference once on the chosen
// backend, writing metrics/reference.jsonl. Actors, evaluators, replay and the learner
// join here as their issues land.
#include <ATen/Parallel.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>

#include "kf/common/config.h"
#include "kf/common/log.h"
#include "kf/common/run_dir.h"
#include "kf/tasks/timing.h"

using namespace kf::tasks;

namespace {
kf::LogLevel parse_level(const std::string& s) {
  if (s == "debug") return kf::LogLevel::Debug;
  if (s == "warn") return kf::LogLevel::Warn;
  if (s == "error") return kf::LogLevel::Error;
  return kf::LogLevel::Info;
}
}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"KernelForge launcher"};
  std::string config_file;
  std::vector<std::string> sets;
  std::string name;
  app.add_option("config", config_file, "YAML config (see configs/)")->required();
  app.add_option("--set", sets, "override a key: a.b=value (repeatable)");
  app.add_option("--name", name, "run name (overrides run.name)");
  CLI11_PARSE(app, argc, argv);
  kf::log_init("launch", 0);

  kf::Config cfg;
  try {
    if (!name.empty()) sets.push_back("run.name=" + name);
    cfg = kf::Config::load(config_file, sets);
  } catch (const kf::Error& e) {
    kf::log_error("config rejected: ", e.what(), "; nothing was started");
    return 2;
  }
  try {
    kf::RunDir run = kf::RunDir::create(cfg.get_string("run.root"), cfg.get_string("run.name"));
    kf::write_file_atomic(run.path() + "/config.yaml", cfg.to_yaml());
    kf::log_init("launch", 0, run.log_file("launch", 0));
    kf::log_set_level(parse_level(cfg.get_string("run.log_level")));
    kf::log_info("run directory ", run.path(), " (config ", config_file, ")");

    const Backend backend = resolve_backend(cfg.get_string("run.backend"));
    const std::string backend_s = backend_name(backend);
    const at::Device device = backend_device(backend);
    auto all = Task::load_all(cfg.get_string("tasks.dir"));
    const auto levels = cfg.get_ints("tasks.levels");
    const auto include = cfg.get_strings("tasks.include");
    std::vector<std::shared_ptr<const Task>> tasks;
    for (const auto& t : all) {
      bool level_ok = std::find(levels.begin(), levels.end(), t->level()) != levels.end();
      bool name_ok = include.empty() || std::find(include.begin(), include.end(), t->name()) != include.end();
      if (level_ok && name_ok && t->has_backend(backend)) tasks.push_back(t);
    }
    kf::log_info("backend ", backend_s, ": ", tasks.size(), " of ", all.size(), " tasks selected");
    if (tasks.empty()) throw kf::Error("no task matches tasks.levels/tasks.include for backend " + backend_s);

    std::ofstream metrics(run.sub("metrics") + "/reference.jsonl");
    const int warmup = static_cast<int>(cfg.get_int("reference.warmup"));
    const int trials = static_cast<int>(cfg.get_int("reference.trials"));
    const uint64_t seed = static_cast<uint64_t>(cfg.get_int("run.seed"));
    int failed = 0;
    std::printf("%-36s %5s %10s\n", "task", "level", "ref_ms");
    for (const auto& t : tasks) {
      try {
        auto ref = t->new_reference(backend, device);
        auto inputs = t->make_inputs(backend, seed, device);
        TimingStats s = time_reference(*ref, inputs, device, warmup, trials);
        metrics << nlohmann::json{{"task", t->name()}, {"backend", backend_s}, {"median_ms", s.median_ms},
                                  {"p10_ms", s.p10_ms}, {"p90_ms", s.p90_ms}}
                       .dump()
                << "\n";
        std::printf("%-36s %5d %10.3f\n", t->name().c_str(), t->level(), s.median_ms);
        std::fflush(stdout);
      } catch (const std::exception& e) {
        ++failed;
        kf::log_error("task ", t->name(), " reference failed: ", e.what(), "; skipping it");
      }
    }
    kf::log_info("done: ", tasks.size() - failed, " references ran, ", failed, " failed; metrics in ",
                 run.sub("metrics"), "/reference.jsonl");
    return failed ? 1 : 0;
  } catch (const std::exception& e) {
    kf::log_error("launch failed: ", e.what(), "; stopping");
    return 1;
  }
}
