// kf-reference: load imported tasks, run and time their C++ references, and compare them
// with Python eager PyTorch (golden files). Used by tools/gpu-check and bench/.
//   kf-reference --tasks build/tasks [--task NAME]... [--backend cpu|cuda] [--check-golden]
//                [--warmup N] [--trials N] [--json]
// Exit: 0 all good, 1 a task failed (error or golden mismatch), 2 usage error.
#include <ATen/Parallel.h>

#include "kf/common/cli.h"
#include "kf/common/error.h"
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>

#include "kf/common/log.h"
#include "kf/tasks/tasks.h"

using namespace kf::tasks;

int main(int argc, char** argv) {
  CLI::App app{"Run and time task references (C++, no Python)"};
  std::string tasks_dir = "build/tasks", backend_s = "cpu";
  std::vector<std::string> only;
  int warmup = 2, trials = 5, threads = 0;
  bool golden = false, json_out = false;
  double golden_tol = 1e-5;
  app.add_option("--tasks", tasks_dir, "folder of imported task artifacts");
  app.add_option("--task", only, "task name (repeatable; default: all)");
  app.add_option("--backend", backend_s, "cpu or cuda")->check(CLI::IsMember({"cpu", "cuda"}));
  app.add_option("--warmup", warmup, "untimed calls before timing")->check(CLI::NonNegativeNumber);
  app.add_option("--trials", trials, "timed calls (median reported); 0 skips timing")->check(CLI::NonNegativeNumber);
  app.add_option("--threads", threads, "intra-op CPU threads (0: libtorch default)");
  app.add_flag("--check-golden", golden, "compare with Python eager outputs (cpu artifacts)");
  app.add_option("--golden-tol", golden_tol, "max relative error allowed by --check-golden");
  app.add_flag("--json", json_out, "one JSON object per task on stdout");
  KF_CLI_PARSE(app, argc, argv);
  kf::log_init("reference", 0);
  if (threads > 0) at::set_num_threads(threads);

  int failures = 0;
  try {
    const Backend backend = parse_backend(backend_s);
    const at::Device device = backend_device(backend);
    auto tasks = Task::load_all(tasks_dir);
    if (!only.empty()) {
      std::vector<std::shared_ptr<const Task>> keep;
      for (const auto& name : only) {
        auto it = std::find_if(tasks.begin(), tasks.end(), [&](const auto& t) { return t->name() == name; });
        if (it == tasks.end()) throw kf::Error(tasks_dir + ": no task named '" + name + "'");
        keep.push_back(*it);
      }
      tasks = keep;
    }
    if (!json_out)
      std::printf("%-36s %-5s %-5s %10s %10s %10s %12s\n", "task", "level", "mode", "median_ms", "p10_ms", "p90_ms",
                  golden ? "golden_err" : "");
    for (const auto& task : tasks) {
      nlohmann::json row = {
          {"task", task->name()}, {"level", task->level()}, {"backend", backend_s}, {"mode", task->mode()}};
      std::string status = "ok";
      try {
        if (golden) {
          GoldenResult g = check_golden(*task);
          row["golden_inputs_equal"] = g.inputs_equal;
          row["golden_max_rel_error"] = g.max_rel_error;
          if (!g.problem.empty())
            status = g.problem;
          else if (!g.inputs_equal)
            status = "C++ inputs differ from Python's get_inputs() for the same seed";
          else if (g.max_rel_error > golden_tol)
            status = "golden mismatch";
        }
        if (trials > 0) {
          if (!task->has_backend(backend)) throw kf::Error(task->name() + ": not imported for backend " + backend_s);
          auto ref = task->new_reference(backend, device);
          auto inputs = task->make_inputs(backend, 0, device);
          TimingStats s = time_reference(*ref, inputs, device, warmup, trials);
          row["median_ms"] = s.median_ms;
          row["p10_ms"] = s.p10_ms;
          row["p90_ms"] = s.p90_ms;
          row["trials_ms"] = s.trials_ms;
        }
      } catch (const std::exception& e) {
        status = kf::message_of(e);
      }
      row["status"] = status;
      if (status != "ok") ++failures;
      if (json_out) {
        std::cout << row.dump() << std::endl;
      } else {
        auto num = [&](const char* k) { return row.contains(k) ? row[k].get<double>() : 0.0; };
        std::printf("%-36s %-5d %-5s %10.3f %10.3f %10.3f %12.2e %s\n", task->name().c_str(), task->level(),
                    task->mode().c_str(), num("median_ms"), num("p10_ms"), num("p90_ms"), num("golden_max_rel_error"),
                    status == "ok" ? "" : status.c_str());
        std::fflush(stdout);
      }
    }
    if (!json_out) std::printf("%zu tasks, %d failed\n", tasks.size(), failures);
  } catch (const std::exception& e) {
    kf::log_error("kf-reference failed: ", kf::message_of(e), "; stopping");
    return 2;
  }
  return failures ? 1 : 0;
}
