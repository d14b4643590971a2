// bench_evaluator: the evaluator's throughput figures (issue 3's benchmark).
//   compile latency of a typical candidate, cold cache (median, p90), next to
//     torch.utils.cpp_extension.load_inline of the same kernel (load_inline_bench.py)
//   verified candidates per minute on level-1 tasks (compile + full verification)
//   timing reproducibility: the same kernels in two separate kf-eval processes,
//     p90 over kernels of |speedup1 - speedup2| / mean
// Rows: BENCH|evaluator|<case>|<metric>|<value>|<unit>, then a table.
//   bench_evaluator [--backend cpu|cuda] [--tasks DIR] [--compile-reps N] [--python PY]
//                   [--no-load-inline] [--repro-runs 2]
#include <ATen/Parallel.h>
#include <sys/wait.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "kf/common/log.h"
#include "kf/evaluator/evaluator.h"
#include "kf/tasks/tasks.h"

using namespace kf::evaluator;
using Clock = std::chrono::steady_clock;

namespace {
std::string slurp(const std::string& p) {
  std::ifstream f(p);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}
std::string run_capture(const std::string& cmd, int* rc) {
  FILE* p = popen(cmd.c_str(), "r");
  std::string out;
  char buf[4096];
  while (size_t n = fread(buf, 1, sizeof buf, p)) out.append(buf, n);
  int st = pclose(p);
  *rc = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return out;
}
void row(const std::string& c, const std::string& m, double v, const std::string& u) {
  std::printf("BENCH|evaluator|%s|%s|%.4g|%s\n", c.c_str(), m.c_str(), v, u.c_str());
  std::fflush(stdout);
}
}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Evaluator benchmark"};
  std::string backend_s = "cpu", tasks_dir = "build/tasks", python, eval_bin;
  int compile_reps = 5, li_reps = 3, threads = 0;
  bool no_li = false, no_repro = false;
  int throughput_rounds = 3;
  app.add_option("--backend", backend_s)->check(CLI::IsMember({"cpu", "cuda"}));
  app.add_option("--tasks", tasks_dir);
  app.add_option("--compile-reps", compile_reps);
  app.add_option("--load-inline-reps", li_reps);
  app.add_option("--python", python, "python with torch (default $KF_PYTHON or python3)");
  app.add_option("--kf-eval", eval_bin, "kf-eval binary for the reproducibility runs");
  app.add_option("--threads", threads);
  app.add_flag("--no-load-inline", no_li);
  app.add_flag("--no-repro", no_repro);
  app.add_option("--throughput-rounds", throughput_rounds, "distinct candidates per kernel in the throughput case");
  CLI11_PARSE(app, argc, argv);
  kf::log_init("bench", 0);
  kf::log_set_level(kf::LogLevel::Warn);
  if (threads > 0) at::set_num_threads(threads);
  if (python.empty()) python = std::getenv("KF_PYTHON") ? std::getenv("KF_PYTHON") : "python3";
  const bool cuda = backend_s == "cuda";
  const auto backend = cuda ? kf::tasks::Backend::CUDA : kf::tasks::Backend::CPU;
  const std::string kdir = KF_KERNELS_DIR;
  const std::string ext = cuda ? ".cu" : ".cpp", sub = cuda ? "cuda/" : "cpu/";

  // --- 1. compile latency, cold cache: a unique comment makes every compile a miss
  std::vector<double> cs;
  {
    CompileOptions co;
    char tmpl[] = "/tmp/kf-bench-cache-XXXXXX";
    co.cache_dir = mkdtemp(tmpl);
    CompileService svc(co);
    const std::string src = slurp(kdir + "/" + sub + "good_relu" + ext);
    for (int i = 0; i < compile_reps; ++i) {
      CompileResult r = svc.compile(src + "\n// bench rep " + std::to_string(i) + " " +
                                        std::to_string(Clock::now().time_since_epoch().count()) + "\n",
                                    cuda ? kf::KF_BACKEND_CUDA : kf::KF_BACKEND_CPU);
      if (!r.ok) {
        std::fprintf(stderr, "compile failed: %s\n", r.diagnostics.c_str());
        return 1;
      }
      cs.push_back(r.seconds);
    }
  }
  TimeSummary c = summarize(cs);
  row("compile_" + backend_s, "median", c.median, "s");
  row("compile_" + backend_s, "p90", c.p90, "s");
  TimeSummary li;
  if (!no_li) {
    int rc = 0;
    std::string out = run_capture(python + " " + KF_BENCH_DIR + "/load_inline_bench.py --backend " + backend_s +
                                      " --reps " + std::to_string(li_reps) + " 2>&1",
                                  &rc);
    std::vector<double> v;
    std::istringstream in(out);
    std::string line;
    while (std::getline(in, line))
      if (line.rfind("LOADINLINE|", 0) == 0) v.push_back(std::stod(line.substr(11)));
    if (v.empty()) std::fprintf(stderr, "load_inline side failed:\n%s\n", out.substr(0, 2000).c_str());
    li = summarize(v);
    if (li.n) {
      row("load_inline_" + backend_s, "median", li.median, "s");
      row("load_inline_" + backend_s, "p90", li.p90, "s");
      row("compile_" + backend_s, "speedup_vs_load_inline", li.median / c.median, "x");
    }
  }

  // --- 2. verified candidates per minute: level-1 good kernels, production settings.
  // As in a run, compiles go to the pool while verification proceeds (the pool works
  // ahead); every candidate is a distinct source, so every compile is a cache miss.
  const std::vector<std::pair<std::string, std::string>> set = {
      {"001_relu", "good_relu"},
      {"002_gelu", "good_gelu"},
      {"021_softmax", "good_softmax"},
      {cuda ? "030_matmul_square" : "024_layernorm", cuda ? "good_matmul_cublas" : "good_layernorm"}};
  EvalOptions eo;
  if (threads > 0) eo.cpu_threads = threads;
  char tmpl2[] = "/tmp/kf-bench-cache2-XXXXXX";
  eo.compile.cache_dir = mkdtemp(tmpl2);
  Evaluator ev(eo);
  std::vector<std::shared_ptr<const kf::tasks::Task>> tasks;
  for (const auto& st : set) tasks.push_back(kf::tasks::Task::load(tasks_dir + "/" + st.first));
  int verified = 0, total = 0;
  std::vector<std::tuple<std::string, double, double, std::string>> rows;
  const auto t0 = Clock::now();
  std::vector<std::shared_future<CompileResult>> pending;
  std::vector<size_t> which;
  for (int round = 0; round < throughput_rounds; ++round)
    for (size_t k = 0; k < set.size(); ++k) {
      pending.push_back(ev.compiler().submit(
          slurp(kdir + "/" + sub + set[k].second + ext) + "\n// candidate " + std::to_string(round) + "\n",
          cuda ? kf::KF_BACKEND_CUDA : kf::KF_BACKEND_CPU));
      which.push_back(k);
    }
  for (size_t i = 0; i < pending.size(); ++i) {
    const CompileResult cr = pending[i].get();
    const size_t k = which[i];
    Result r = ev.evaluate_compiled(*tasks[k], backend, cr, uint64_t(total));
    ++total;
    verified += r.ok();
    if (i < set.size()) {
      rows.emplace_back(set[k].first, r.speedup, r.verify_s, verdict_name(r.verdict));
      std::fprintf(stderr, "%s\n", to_text(r).c_str());  // phase timestamps are in the checks
    }
  }
  const double minutes = std::chrono::duration<double>(Clock::now() - t0).count() / 60;
  row("throughput_" + backend_s, "verified_per_min", verified / minutes, "1/min");
  row("throughput_" + backend_s, "candidates", total, "count");

  // --- 3. reproducibility: two separate kf-eval processes per kernel
  std::vector<double> diffs;
  std::vector<std::tuple<std::string, double, double>> rep_rows;
  if (!no_repro && !eval_bin.empty()) {
    for (const auto& [task_name, kernel] : set) {
      double s[2] = {0, 0};
      for (int run = 0; run < 2; ++run) {
        int rc = 0;
        std::string out =
            run_capture(eval_bin + " " + task_name + " " + kdir + "/" + sub + kernel + ext + " --json --tasks " +
                            tasks_dir + " --seed " + std::to_string(100 + run) +
                            (threads > 0 ? " --threads " + std::to_string(threads) : std::string()) + " 2>/dev/null",
                        &rc);
        try {
          s[run] = nlohmann::json::parse(out)["speedup"].get<double>();
        } catch (...) {
          s[run] = 0;
        }
      }
      if (s[0] > 0 && s[1] > 0) diffs.push_back(std::abs(s[0] - s[1]) / (0.5 * (s[0] + s[1])));
      rep_rows.emplace_back(task_name, s[0], s[1]);
    }
    TimeSummary d = summarize(diffs);
    row("repro_" + backend_s, "speedup_diff_p90", 100 * d.p90, "%");
    row("repro_" + backend_s, "speedup_diff_median", 100 * d.median, "%");
  }

  // --- table
  std::printf("\nEvaluator benchmark (%s backend)\n", backend_s.c_str());
  std::printf("  compile, cold cache      median %7.2f s   p90 %7.2f s   (n=%d)\n", c.median, c.p90, c.n);
  if (li.n)
    std::printf("  load_inline, same kernel median %7.2f s   p90 %7.2f s   (n=%d)  -> %.1fx faster\n", li.median,
                li.p90, li.n, li.median / c.median);
  std::printf("  verified candidates      %.1f per minute (%d/%d ok, compile pool + serial verification)\n",
              verified / minutes, verified, total);
  for (const auto& [t, sp, secs, v] : rows)
    std::printf("    %-20s %-14s speedup %6.3f  verify %5.2f s\n", t.c_str(), v.c_str(), sp, secs);
  if (!rep_rows.empty()) {
    std::printf("  reproducibility (two kf-eval runs): p90 |diff| %.1f%%\n", 100 * summarize(diffs).p90);
    for (const auto& [t, a, b] : rep_rows) std::printf("    %-20s %6.3f vs %6.3f\n", t.c_str(), a, b);
  }
  return 0;
}
