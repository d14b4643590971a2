// kf-eval: verify one kernel against one task and print the report (tools/eval).
//   kf-eval TASK KERNEL [--json] [--backend cpu|cuda] [--tasks DIR] [--trials N] ...
// TASK is an artifact folder or a task name under --tasks. KERNEL is the source file
// (.cu: CUDA backend by default; anything else: CPU).
// The report gives the speedup with its 95 % interval ("1.234x (95 % 1.180–1.290)"), flags
// an unstable timing (the speedup is then the interval's lower bound) and a degenerate task
// (no speed reward); --json has the same fields (result.cpp).
// Exit: 0 ok, 1 kernel rejected (any other verdict), 2 usage error, 3 evaluator error.
#include <ATen/Parallel.h>

#include "kf/common/cli.h"
#include <cstdio>
#include <fstream>
#include <iostream>

#include "kf/common/error.h"
#include "kf/common/fsutil.h"
#include "kf/common/log.h"
#include "kf/evaluator/evaluator.h"
#include "kf/tasks/tasks.h"
#include "modelnew.h"  // ModelNew (KernelBench-style .py) candidates: evaluator/modelnew/
#include "worker_openmp.h"

using namespace kf::evaluator;

int main(int argc, char** argv) {
  exec_with_worker_openmp();  // OpenMP threads sleep when they wait, as the worker's (worker_openmp.h)
  CLI::App app{"Verify a candidate kernel against a task and time it"};
  std::string task_arg, kernel_path, backend_s, tasks_dir, arch = "sm_90", cache;
  bool json = false;
  EvalOptions o;
  app.add_option("task", task_arg, "task artifact folder, or task name under --tasks")->required();
  app.add_option("kernel", kernel_path, "kernel source file (.cu for CUDA, .cpp for CPU)")->required();
  app.add_flag("--json", json, "print a machine-readable report");
  app.add_option("--backend", backend_s, "cpu or cuda (default: from the file extension)")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  app.add_option("--tasks", tasks_dir, "folder of imported tasks (default $KF_TASKS_DIR or build/tasks)");
  app.add_option("--trials", o.trials, "timed trials")->check(CLI::PositiveNumber);
  app.add_option("--warmup", o.warmup, "untimed calls before timing")->check(CLI::NonNegativeNumber);
  app.add_option("--correctness-sets", o.correctness_sets, "fresh distribution sets")->check(CLI::Range(2, 100));
  app.add_option("--seed", o.seed, "run seed for inputs");
  app.add_option("--threads", o.cpu_threads, "CPU threads for reference and kernel (0: all)");
  app.add_option("--device", o.device, "CUDA device");
  app.add_option("--cuda-arch", arch, "nvcc -arch value");
  app.add_option("--cache", cache, "compile cache folder");
  app.add_option("--call-timeout", o.min_call_timeout_s, "minimum wall-clock limit per kernel call (s)");
  app.add_option("--max-spread", o.max_spread,
                 "spread (p90-p10)/median of the trials above this after --max-trials: the timing is flagged "
                 "unstable and the speedup is its 95 % interval's lower bound");
  app.add_option("--max-trials", o.max_trials, "most timed trials while the spread is too wide");
  bool no_private_proc = false;
  app.add_flag("--no-private-proc", no_private_proc,
               "workers see the host's /proc and run as nobody (to compare timings with and without)");
  app.add_flag("--private-proc-cuda", o.sandbox.private_proc_cuda,
               "CUDA workers get a private /proc and a user of their own too (not yet measured on a GPU)");
  app.add_option("--ref-slowdown-limit", o.ref_slowdown_limit,
                 "the reference's fastest timed run over its baseline's median beyond this: an environment failure")
      ->check(CLI::Range(1.0, 1e6));
  std::string check_seed;
  app.add_option("--check-seed", check_seed,
                 "replay a verification: the secret seed its check anti.check_plan recorded (0x...); default: a "
                 "fresh one");
  int kb_trials = 100;  // ModelNew candidates only
  app.add_option("--kb-trials", kb_trials, ".py (ModelNew) candidates: KernelBench-protocol timed trials")
      ->check(CLI::PositiveNumber);
  KF_CLI_PARSE(app, argc, argv);
  if (no_private_proc) o.sandbox.private_proc = false;
  if (!check_seed.empty()) {
    size_t used = 0;
    try {
      o.check_seed = std::stoull(check_seed, &used, 0);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != check_seed.size() || o.check_seed == 0) {
      std::fprintf(stderr, "tools/eval: --check-seed: '%s' is not a nonzero number (e.g. 0x5a11c0de5eed0001)\n",
                   check_seed.c_str());
      return 2;
    }
  }
  kf::log_init("evaluator", 0);
  kf::log_set_level(kf::LogLevel::Warn);
  o.compile.cuda_arch = arch;
  o.compile.cache_dir = cache;
  if (o.cpu_threads > 0) at::set_num_threads(o.cpu_threads);

  std::string source;
  std::shared_ptr<const kf::tasks::Task> task;
  kf::tasks::Backend backend;
  try {
    if (!kf::fsutil::is_file(kernel_path)) throw kf::Error("kernel file '" + kernel_path + "' not found");
    std::ifstream f(kernel_path);
    source.assign(std::istreambuf_iterator<char>(f), {});
    // A .py (ModelNew) candidate runs on the GPU when there is one.
    if (backend_s.empty() && kf::evaluator::modelnew::is_modelnew_candidate(kernel_path))
      backend_s = kf::tasks::cuda_available() ? "cuda" : "cpu";
    if (backend_s.empty()) backend_s = kf::fsutil::extension(kernel_path) == ".cu" ? "cuda" : "cpu";
    backend = kf::tasks::parse_backend(backend_s);
    std::string dir = task_arg;
    if (!kf::fsutil::exists(dir + "/task.json")) {
      if (tasks_dir.empty()) {
        const char* e = std::getenv("KF_TASKS_DIR");
        tasks_dir = e && *e ? e : "build/tasks";
      }
      dir = tasks_dir + "/" + task_arg;
    }
    if (!kf::fsutil::exists(dir + "/task.json"))
      throw kf::Error("no task artifact at '" + task_arg + "' or '" + dir + "'");
    task = kf::tasks::Task::load(dir);
    if (!task->has_backend(backend)) throw kf::Error("task " + task->name() + " has no " + backend_s + " artifact");
    if (backend == kf::tasks::Backend::CUDA && !kf::tasks::cuda_available())
      throw kf::Error("backend cuda asked for, but no CUDA device is visible");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kf-eval: %s\n", e.what());
    return 2;
  }
  try {
    if (kf::evaluator::modelnew::is_modelnew_candidate(kernel_path)) {  // hook: evaluator/modelnew/
      kf::evaluator::modelnew::Options mo;
      mo.eval = o;
      mo.kb_perf_trials = kb_trials;
      auto out = kf::evaluator::modelnew::evaluate(*task, backend, source, mo, 0);
      std::cout << (json ? kf::evaluator::modelnew::to_json(out, 2) + "\n" : kf::evaluator::modelnew::to_text(out));
      return out.result.ok() ? 0 : 1;
    }
    Evaluator ev(o);
    Result r = ev.evaluate(*task, backend, source, 0);
    if (json)
      std::cout << to_json(r, 2) << "\n";
    else
      std::cout << to_text(r);
    return r.ok() ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kf-eval: evaluator error: %s\n", e.what());
    return 3;
  }
}
