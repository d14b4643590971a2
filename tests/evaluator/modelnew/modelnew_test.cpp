// ModelNew candidates (evaluator/modelnew/): each candidate file in this folder through the
// whole path (confined compile step, Python sandbox worker, the protocol's checks, probe), with
// the verdict, the reason's words and the torch_only flag it must get. CUDA entries skip
// without a device.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <map>
#include <sstream>

#include "kf/tasks/tasks.h"
#include "modelnew.h"

using namespace kf::evaluator;

namespace {

std::string build_dir() {
  const char* e = std::getenv("KF_BUILD_DIR");
  return e && *e ? e : KF_BUILD_DIR_DEFAULT;
}

std::string read(const std::string& rel) {
  std::ifstream f(std::string(KF_MN_CANDIDATES) + "/" + rel);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::shared_ptr<const kf::tasks::Task> task(const std::string& name) {
  static std::map<std::string, std::shared_ptr<const kf::tasks::Task>> cache;
  auto& t = cache[name];
  if (!t) t = kf::tasks::Task::load(build_dir() + "/tasks/" + name);
  return t;
}

// The full protocol with fewer calls, for a loaded 2-core CI machine.
modelnew::Options options(bool cuda) {
  modelnew::Options o;
  o.eval.compile.cache_dir = build_dir() + "/evaluator-test-cache";
  o.eval.correctness_sets = 2;
  o.eval.warmup = 1;
  o.eval.trials = 3;
  o.eval.max_trials = 4;
  o.eval.max_spread = 100.0;
  o.eval.min_call_timeout_s = cuda ? 10 : 5;
  o.eval.cpu_threads = 2;
  o.kb_correct_trials = 2;
  o.kb_perf_trials = 3;
  return o;
}

struct Entry {
  std::string file, task;
  bool cuda;
  std::string verdict, reason;  // reason: words the reason (or diagnostics) must contain
  int torch_only;               // -1: not asserted; 0/1: the probe's flag
  std::string name;
};

std::vector<Entry> entries() {
  std::vector<Entry> v = {
      {"cpu/good_relu_inline.py", "001_relu", false, "ok", "", 0},
      {"cpu/torch_only_relu.py", "001_relu", false, "ok", "", 1},
      {"cpu/silent_fallback_relu.py", "001_relu", false, "ok", "", 1},
      {"cpu/cached_result_relu.py", "001_relu", false, "rejected_cheat", "cached", -1},
      {"cpu/input_modification_relu.py", "001_relu", false, "rejected_cheat", "modifies its inputs", -1},
      {"cpu/fp16_output_relu.py", "001_relu", false, "rejected_cheat", "precision downgrade: output 0 is float16", -1},
      {"cpu/fp16_compute_linear.py", "034_linear", false, "rejected_cheat", "precision downgrade", -1},
      {"cpu/good_linear_inline.py", "034_linear", false, "ok", "", 0},
      {"cpu/renamed_params_linear.py", "034_linear", false, "runtime_error", "do not match the task's Model", -1},
      {"cpu/host_file_at_import.py", "001_relu", false, "compile_error", "No such file", -1},
      {"cpu/socket_in_forward.py", "001_relu", false, "rejected_cheat", "forbidden system call", -1},
      {"cuda/good_relu_cuda.py", "001_relu", true, "ok", "", 0},
      {"cuda/side_stream_relu_cuda.py", "001_relu", true, "rejected_cheat", "unsynchronised side stream", -1},
      {"cuda/silent_fallback_relu_cuda.py", "001_relu", true, "ok", "", 1},
      {"cpu/torch_only_relu.py", "001_relu", true, "ok", "", 1},
      {"cpu/cached_result_relu.py", "001_relu", true, "rejected_cheat", "cached", -1},
      {"cpu/input_modification_relu.py", "001_relu", true, "rejected_cheat", "modifies its inputs", -1},
      {"cpu/fp16_output_relu.py", "001_relu", true, "rejected_cheat", "precision downgrade", -1},
  };
  for (auto& e : v) {
    e.name = (e.cuda ? "Cuda_" : "Cpu_") + e.file.substr(e.file.find('/') + 1);
    for (char& c : e.name)
      if (!isalnum(static_cast<unsigned char>(c))) c = '_';
  }
  return v;
}

void PrintTo(const Entry& e, std::ostream* os) { *os << e.file << " on " << e.task << (e.cuda ? " (cuda)" : " (cpu)"); }

class ModelNewTest : public ::testing::TestWithParam<Entry> {};

TEST_P(ModelNewTest, VerdictReasonAndCustomCodeFlag) {
  const Entry& e = GetParam();
  if (e.cuda && !kf::tasks::cuda_available())
    GTEST_SKIP() << "no CUDA device visible: " << e.file << " runs on the GPU machine";
  at::set_num_threads(2);
  const auto b = e.cuda ? kf::tasks::Backend::CUDA : kf::tasks::Backend::CPU;
  modelnew::Outcome o = modelnew::evaluate(*task(e.task), b, read(e.file), options(e.cuda), 1);
  const Result& r = o.result;
  std::printf("%s on %s: %s (%s) torch_only=%d custom: %s | kernelbench %d/%d %.3fx\n", e.file.c_str(), e.task.c_str(),
              verdict_name(r.verdict), r.reason.c_str(), int(o.torch_only), o.custom_detail.c_str(), o.kb_correct,
              o.kb_trials, o.kb_speedup);
  EXPECT_EQ(verdict_name(r.verdict), e.verdict) << r.reason << "\n" << r.diagnostics;
  if (!e.reason.empty())
    EXPECT_NE((r.reason + "\n" + r.diagnostics).find(e.reason), std::string::npos) << r.reason << "\n" << r.diagnostics;
  if (e.torch_only >= 0) {
    ASSERT_TRUE(o.probe_ran) << o.probe_error;
    EXPECT_EQ(o.torch_only, e.torch_only == 1) << o.custom_detail;
    EXPECT_EQ(o.kb_trials, 2);
    EXPECT_EQ(o.kb_correct, 2) << "an ok candidate passes KernelBench's check too";
    EXPECT_GT(o.kb_cand_ms, 0);
    EXPECT_GT(o.kb_ref_ms, 0);
  }
  if (r.ok()) EXPECT_GT(r.speedup, 0);
}

INSTANTIATE_TEST_SUITE_P(Candidates, ModelNewTest, ::testing::ValuesIn(entries()),
                         [](const ::testing::TestParamInfo<Entry>& i) { return i.param.name; });

// A CUDA extension (nvcc through torch's load_inline) builds in the confined compile step,
// where no GPU is needed: the riskiest part of the CUDA path that a CPU machine can check.
TEST(ModelNewTest, CudaExtensionBuildsInTheConfinedCompileStep) {
  if (access("/usr/local/cuda/bin/nvcc", X_OK) != 0) GTEST_SKIP() << "no nvcc at /usr/local/cuda/bin";
  modelnew::Options o = options(false);
  CompileResult cr = modelnew::compile(*task("001_relu"), kf::tasks::Backend::CPU, read("cuda/good_relu_cuda.py"), o);
  EXPECT_TRUE(cr.ok) << cr.diagnostics;
  EXPECT_FALSE(cr.environment_failure) << cr.diagnostics;
}

// The JSON of tools/eval for a .py candidate: Result's fields plus torch_only and modelnew.
TEST(ModelNewTest, JsonCarriesTheFlagAndKernelBenchFields) {
  modelnew::Outcome o;
  o.result.task = "001_relu";
  o.probe_ran = true;
  o.torch_only = true;
  o.custom_detail = "no load_inline extension";
  o.kb_correct = 5;
  o.kb_trials = 5;
  o.kb_speedup = 1.5;
  const std::string j = modelnew::to_json(o);
  EXPECT_NE(j.find("\"torch_only\":true"), std::string::npos) << j;
  EXPECT_NE(j.find("\"kb_speedup\":1.5"), std::string::npos) << j;
  EXPECT_NE(modelnew::to_text(o).find("TORCH ONLY"), std::string::npos);
  EXPECT_TRUE(modelnew::is_modelnew_candidate("x/y.py"));
  EXPECT_FALSE(modelnew::is_modelnew_candidate("x/y.cu"));
}

}  // namespace
