// The seed kernel corpus (corpus/, docs/corpus.md): the generator's output is committed and
// current; the manifest lists only kernels recorded as passing (CPU: verdict ok; CUDA:
// compiled or ok); in the two families with the largest recorded naive/fastest gap the naive
// and fastest kernels pass tools/eval and naive is slower; one kernel of every other family
// passes tools/eval; one CUDA kernel per family compiles with the evaluator's CompileService.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <algorithm>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "../test_support.h"
#include "kf/evaluator/evaluator.h"

namespace {
using nlohmann::json;

int run_cmd(const std::string& cmd, std::string* out) {
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return -1;
  char buf[4096];
  out->clear();
  while (size_t n = fread(buf, 1, sizeof buf, p)) out->append(buf, n);
  const int st = pclose(p);
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

std::string corpus_dir() { return kf::test::source_dir() + "/corpus"; }

json load_json(const std::string& path) {
  const std::string text = kf::test::read_file(path);
  if (text.empty()) throw std::runtime_error("cannot read " + path);
  return json::parse(text);
}

std::string tasks_dir() { return kf::test::env_or("KF_TASKS_DIR", kf::test::build_dir() + "/tasks"); }

// Evaluates one corpus kernel with tools/eval's binary; returns the JSON report.
json eval_kernel(const std::string& task, const std::string& file) {
  const std::string cmd = std::string(KF_EVAL_BIN) + " " + task + " " + corpus_dir() + "/" + file + " --json --tasks " +
                          tasks_dir() + " --cache " + kf::test::build_dir() + "/corpus-test-cache" +
                          " --trials 3 --warmup 1 --correctness-sets 2 --max-spread 1000 --max-trials 3" +
                          // the reference-baseline check has its own test (a loaded CI host)
                          " --ref-slowdown-limit 20 2>/dev/null";
  std::string out;
  const int rc = run_cmd(cmd, &out);
  if (rc != 0 && rc != 1) throw std::runtime_error("kf-eval exit " + std::to_string(rc) + ": " + out);
  return json::parse(out);
}
}  // namespace

TEST(CorpusTest, GeneratedFilesAreCurrent) {
  std::string out;
  const int rc = run_cmd(kf::test::python() + " " + corpus_dir() + "/generate.py --check 2>&1", &out);
  EXPECT_EQ(rc, 0) << out;
}

TEST(CorpusTest, ManifestListsOnlyVerifiedCpuKernels) {
  const json m = load_json(corpus_dir() + "/manifest.json");
  const json v = load_json(corpus_dir() + "/verified_cpu.json");
  ASSERT_TRUE(v.contains("header"));
  int n = 0;
  for (const auto& e : m) {
    if (e.at("backend") != "cpu") continue;
    const std::string f = e.at("file");
    ASSERT_TRUE(v.contains(f)) << f << " is in the manifest but not in verified_cpu.json";
    EXPECT_EQ(v[f].at("verdict"), "ok") << f;
    ++n;
  }
  EXPECT_GT(n, 0);
}

TEST(CorpusTest, ManifestListsOnlyCompiledOrVerifiedCudaKernels) {
  const json m = load_json(corpus_dir() + "/manifest.json");
  const json v = load_json(corpus_dir() + "/verified_cuda.json");
  ASSERT_TRUE(v.contains("header"));
  int n = 0;
  for (const auto& e : m) {
    if (e.at("backend") != "cuda") continue;
    const std::string f = e.at("file");
    ASSERT_TRUE(v.contains(f)) << f << " is in the manifest but not in verified_cuda.json";
    const std::string verdict = v[f].at("verdict");
    // "re-verify": the last verdict says nothing about the kernel (a verifier fault fixed
    // since, the machine's failure, or load); the reason must say which, and it waits for
    // a GPU session. Anything else measured and not ok is a bad corpus kernel.
    const bool pending = verdict == "re-verify" && v[f].at("reason").get<std::string>().rfind("re-verify: ", 0) == 0;
    EXPECT_TRUE(verdict == "ok" || verdict == "compiled, not run" || pending) << f << ": " << verdict;
    ++n;
  }
  EXPECT_GT(n, 0);
}

namespace {
struct Pick {
  std::string family, task, naive, fast;
  double gap = 0;  // fastest / naive recorded speedup of this task
  double naive_speedup = 0;
  double family_gap = 0;  // median gap over the family's tasks
};

// Per family, from verified_cpu.json: the median fastest/naive gap over its tasks, and the
// task (gap >= 3x) whose naive kernel is recorded slowest relative to the reference, i.e.
// where naive is structurally slow (a single thread on compute-bound work) rather than
// slow by timing noise on a loaded machine.
std::vector<Pick> cpu_picks() {
  const json m = load_json(corpus_dir() + "/manifest.json");
  const json v = load_json(corpus_dir() + "/verified_cpu.json");
  std::map<std::string, std::map<std::string, std::vector<json>>> by;  // family -> task -> entries
  for (const auto& e : m)
    if (e.at("backend") == "cpu") by[e.at("family")][e.at("task")].push_back(e);
  std::vector<Pick> picks;
  for (const auto& [family, tasks] : by) {
    Pick best;
    best.family = family;
    std::vector<double> gaps;
    std::string any_fast, any_task;
    for (const auto& [task, es] : tasks) {
      std::string naive, fast;
      double sn = 0, sf = 0;
      for (const auto& e : es) {
        const std::string f = e.at("file");
        if (!v.contains(f) || !v[f].at("speedup").is_number()) continue;
        const double s = v[f].at("speedup");
        if (e.at("variant") == "naive")
          naive = f, sn = s;
        else if (s > sf)
          fast = f, sf = s;
      }
      if (any_fast.empty() && !fast.empty()) any_fast = fast, any_task = task;
      if (naive.empty() || fast.empty() || sn <= 0) continue;
      gaps.push_back(sf / sn);
      if (sf / sn >= 3.0 && (best.task.empty() || sn < best.naive_speedup))
        best = {family, task, naive, fast, sf / sn, sn, 0};
    }
    if (best.task.empty()) best = {family, any_task, "", any_fast, 0, 0, 0};
    std::sort(gaps.begin(), gaps.end());
    best.family_gap = gaps.empty() ? 0 : gaps[gaps.size() / 2];
    if (!best.task.empty()) picks.push_back(best);
  }
  std::sort(picks.begin(), picks.end(), [](const Pick& a, const Pick& b) { return a.family_gap > b.family_gap; });
  return picks;
}

bool have_tasks() { return ::access((tasks_dir() + "/001_relu/task.json").c_str(), R_OK) == 0; }

// Families with a median naive/fastest gap of at least 3x (so a loaded CI machine cannot
// flip the order), largest first.
std::vector<Pick> timed_picks() {
  std::vector<Pick> picks = cpu_picks();
  picks.erase(
      std::remove_if(picks.begin(), picks.end(), [](const Pick& p) { return p.family_gap < 3.0 || p.naive.empty(); }),
      picks.end());
  if (picks.size() > 2) picks.resize(2);
  return picks;
}

// Both kernels of the k-th timed family pass tools/eval, and naive takes longer.
void expect_naive_slower(size_t k) {
  const std::vector<Pick> picks = timed_picks();
  ASSERT_GT(picks.size(), k) << "verified_cpu.json shows fewer than " << k + 1
                             << " families with a 3x naive/fastest gap";
  const Pick& p = picks[k];
  SCOPED_TRACE(p.task + ": " + p.naive + " vs " + p.fast);
  // The fast variant is multi-threaded: a test running beside it on a 2-core machine can
  // slow it more than the single-threaded naive one, so the order is measured up to three
  // times and must show once (it failed once here in a -j2 ctest run and passed alone).
  std::string seen;
  for (int attempt = 0; attempt < 3; ++attempt) {
    const json rn = eval_kernel(p.task, p.naive), rf = eval_kernel(p.task, p.fast);
    ASSERT_EQ(rn.at("verdict"), "ok") << rn.dump();
    ASSERT_EQ(rf.at("verdict"), "ok") << rf.dump();
    const double tn = rn["candidate"]["median_ms"], tf = rf["candidate"]["median_ms"];
    if (tn > tf) return;
    seen += " naive " + std::to_string(tn) + " ms, fastest " + std::to_string(tf) + " ms;";
  }
  ADD_FAILURE() << "the naive kernel was not slower in 3 measurements:" << seen << " (recorded gap " << p.gap << "x)";
}

// The fastest kernel of the picked task of every family not timed above passes tools/eval;
// `half` 0 / 1 splits the families so that each test stays short.
void expect_families_pass(int half) {
  std::vector<Pick> picks = cpu_picks();
  const std::vector<Pick> timed = timed_picks();
  picks.erase(std::remove_if(picks.begin(), picks.end(),
                             [&](const Pick& p) {
                               for (const auto& t : timed)
                                 if (t.family == p.family) return true;
                               return false;
                             }),
              picks.end());
  ASSERT_GE(picks.size(), 2u);
  for (size_t i = half; i < picks.size(); i += 2) {
    const json r = eval_kernel(picks[i].task, picks[i].fast);
    EXPECT_EQ(r.at("verdict"), "ok") << picks[i].fast << ": " << r.dump();
  }
}
}  // namespace

TEST(CorpusTest, CpuNaiveSlowerInLargestGapFamily) {
  if (!have_tasks()) GTEST_SKIP() << "no imported tasks in " << tasks_dir() << " (run tools/import-tasks)";
  expect_naive_slower(0);
}

TEST(CorpusTest, CpuNaiveSlowerInSecondLargestGapFamily) {
  if (!have_tasks()) GTEST_SKIP() << "no imported tasks in " << tasks_dir() << " (run tools/import-tasks)";
  expect_naive_slower(1);
}

TEST(CorpusTest, CpuSampleOfOtherFamiliesPassesEvalPart1) {
  if (!have_tasks()) GTEST_SKIP() << "no imported tasks in " << tasks_dir() << " (run tools/import-tasks)";
  expect_families_pass(0);
}

TEST(CorpusTest, CpuSampleOfOtherFamiliesPassesEvalPart2) {
  if (!have_tasks()) GTEST_SKIP() << "no imported tasks in " << tasks_dir() << " (run tools/import-tasks)";
  expect_families_pass(1);
}

// One CUDA kernel per family (the first file by name), compiled with the evaluator's own
// CompileService and its default nvcc flags (-arch=sm_90). All of them take many minutes on
// 2 cores; corpus/verify.py --backend cuda --compile-only does that (verified_cuda.json).
TEST(CorpusTest, CudaSampleCompiles) {
  kf::evaluator::CompileOptions o;
  if (::access(o.nvcc.c_str(), X_OK) != 0) GTEST_SKIP() << "no nvcc at " << o.nvcc;
  kf::test::TempDir cache("corpus-nvcc");
  o.cache_dir = cache.path;
  o.jobs = 2;
  kf::evaluator::CompileService cs(o);
  const json m = load_json(corpus_dir() + "/manifest.json");
  std::map<std::string, std::string> first;  // family -> file
  for (const auto& e : m)
    if (e.at("backend") == "cuda") {
      auto& f = first[e.at("family")];
      if (f.empty() || e.at("file").get<std::string>() < f) f = e.at("file");
    }
  std::vector<std::string> files, sources;
  for (const auto& [family, f] : first) {
    files.push_back(f);
    sources.push_back(kf::test::read_file(corpus_dir() + "/" + f));
  }
  ASSERT_FALSE(files.empty());
  const auto rs = cs.compile_all(sources, kf::KF_BACKEND_CUDA);
  for (size_t i = 0; i < rs.size(); ++i) EXPECT_TRUE(rs[i].ok) << files[i] << ":\n" << rs[i].diagnostics;
}
