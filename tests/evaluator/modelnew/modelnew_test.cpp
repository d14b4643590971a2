// ModelNew candidates (evaluator/modelnew/): each candidate file in this folder through the
// whole path (confined compile step, Python sandbox worker, the protocol's checks, probe), with
// the verdict, the reason's words and the torch_only flag it must get. CUDA entries skip
// without a device.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <gtest/gtest.h>

#include <unistd.h>

#include <sys/stat.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "kf/common/config.h"
#include "kf/common/fsutil.h"
#include "kf/replay/replay.h"
#include "kf/tasks/tasks.h"
#include "modelnew.h"

using namespace kf::evaluator;
namespace fs = std::filesystem;

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

std::string slurp(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::string run_output(const std::string& cmd) {
  std::string out;
  if (FILE* p = ::popen(cmd.c_str(), "r")) {
    char buf[4096];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
    ::pclose(p);
  }
  return out;
}

// A fresh folder under /tmp (not $TMPDIR: the point is the view's private /tmp).
std::string temp_dir(const std::string& tag) {
  std::string t = "/tmp/" + tag + "-XXXXXX";
  if (!::mkdtemp(t.data())) std::abort();
  ::chmod(t.c_str(), 0755);
  return t;
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
      {"cpu/closes_reply_pipe_relu.py", "001_relu", false, "runtime_error", "worker error: OSError", -1},
      {"cpu/triton_relu.py", "001_relu", false, "ok", "", 0},
      {"cpu/triton_unlaunched_relu.py", "001_relu", false, "ok", "", 1},
      {"cuda/good_relu_cuda.py", "001_relu", true, "ok", "", 0},
      {"cuda/side_stream_relu_cuda.py", "001_relu", true, "rejected_cheat", "unsynchronised side stream", -1},
      {"cuda/silent_fallback_relu_cuda.py", "001_relu", true, "ok", "", 1},
      {"cpu/torch_only_relu.py", "001_relu", true, "ok", "", 1},
      {"cpu/cached_result_relu.py", "001_relu", true, "rejected_cheat", "cached", -1},
      {"cpu/input_modification_relu.py", "001_relu", true, "rejected_cheat", "modifies its inputs", -1},
      {"cpu/fp16_output_relu.py", "001_relu", true, "rejected_cheat", "precision downgrade", -1},
      {"cpu/triton_relu.py", "001_relu", true, "runtime_error", "Triton kernels are verified on the CPU backend only",
       -1},
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
  if (e.file.find("triton_relu") != std::string::npos && !e.cuda)
    EXPECT_NE(o.custom_detail.find("Triton kernels launched during forward: triton.relu_kernel"), std::string::npos)
        << o.custom_detail;
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
// The toolkit is named through a chain of links that leaves the view, as on NVIDIA's
// packages (/usr/local/cuda -> /etc/alternatives/cuda -> /usr/local/cuda-X; the view has no
// /etc): the build must use the toolkit where the links lead, and says so in its build file.
TEST(ModelNewTest, CudaToolkitNamedThroughLinksOutsideTheViewBuilds) {
  if (access("/usr/local/cuda/bin/nvcc", X_OK) != 0) GTEST_SKIP() << "no nvcc at /usr/local/cuda/bin";
  const std::string real = fs::canonical("/usr/local/cuda/bin/nvcc").parent_path().parent_path().string();
  const std::string dir = temp_dir("kf-mn-links");
  fs::create_directories(dir + "/alternatives");
  fs::create_symlink(real, dir + "/alternatives/cuda");
  fs::create_symlink(dir + "/alternatives/cuda", dir + "/cuda");
  modelnew::Options o = options(false);
  o.eval.compile.nvcc = dir + "/cuda/bin/nvcc";
  CompileResult cr = modelnew::compile(*task("001_relu"), kf::tasks::Backend::CPU, read("cuda/good_relu_cuda.py"), o);
  EXPECT_TRUE(cr.ok) << cr.diagnostics;
  EXPECT_FALSE(cr.environment_failure) << cr.diagnostics;
  // The extension's build file names the compiler it ran: the toolkit's real path.
  std::string ninja;
  const std::string job = o.eval.compile.cache_dir + "/modelnew/" + cr.key.substr(0, 32);
  for (const auto& e : fs::recursive_directory_iterator(job))
    if (e.path().filename() == "build.ninja") ninja = slurp(e.path().string());
  EXPECT_NE(ninja.find("nvcc = " + real + "/bin/nvcc"), std::string::npos) << ninja.substr(0, 600);
  kf::fsutil::remove_tree(dir);  // not fs::remove_all: libtorch exports its own, which crashes here
}

// The ModelNew path wherever the checkout lives: the interpreter (a venv) and the scripts
// under /tmp, in folders with spaces, the scripts read-only. The compile view's private
// /tmp used to hide an interpreter under /tmp ("confinement failed at execve: No such file
// or directory"), so every candidate of a clone under /tmp was an environment failure.
TEST(ModelNewTest, RunsWithInterpreterAndScriptsUnderTmpInPathsWithSpaces) {
  const std::string py =
      std::getenv("KF_PYTHON") && *std::getenv("KF_PYTHON") ? std::getenv("KF_PYTHON") : KF_PYTHON_DEFAULT;
  const std::string dir = temp_dir("kf mn where");
  ASSERT_EQ(dir.rfind("/tmp/", 0), 0u) << dir;
  // A venv under /tmp whose site-packages lead (.pth) to the build's packages (torch).
  const std::string venv = dir + "/py env";
  ASSERT_EQ(std::system(("'" + py + "' -m venv --without-pip '" + venv + "'").c_str()), 0);
  const std::string info = run_output("'" + py +
                                      "' -c \"import site,sys;print(site.getsitepackages()[0]);"
                                      "print('python%d.%d' % sys.version_info[:2])\"");
  const std::string site = info.substr(0, info.find('\n'));
  std::string ver = info.substr(info.find('\n') + 1);
  ver = ver.substr(0, ver.find('\n'));
  std::ofstream(venv + "/lib/" + ver + "/site-packages/kf_build_packages.pth") << site << "\n";
  // The scripts, read-only, in a folder with a space.
  const std::string scripts = dir + "/source tree/modelnew";
  fs::create_directories(scripts);
  for (const char* f : {"worker.py", "build_ext.py", "mn_common.py"}) {
    fs::copy_file(std::string(KF_MN_SCRIPTS) + "/" + f, scripts + "/" + f);
    fs::permissions(scripts + "/" + f, fs::perms::owner_read | fs::perms::group_read | fs::perms::others_read);
  }
  fs::permissions(scripts, fs::perms::owner_read | fs::perms::owner_exec | fs::perms::group_read |
                               fs::perms::group_exec | fs::perms::others_read | fs::perms::others_exec);
  modelnew::Options o = options(false);
  o.python = venv + "/bin/python3";
  o.scripts_dir = scripts;
  o.eval.compile.cache_dir = dir + "/cache dir";
  // One thread: the candidate's OpenMP team then has no threads that spin on after a call,
  // which the protocol counts as work after return on a loaded machine (this test is about
  // where the files live, not about threads).
  o.eval.cpu_threads = 1;
  modelnew::Outcome out =
      modelnew::evaluate(*task("001_relu"), kf::tasks::Backend::CPU, read("cpu/good_relu_inline.py"), o, 1);
  EXPECT_EQ(verdict_name(out.result.verdict), std::string("ok")) << out.result.reason << "\n" << out.result.diagnostics;
  EXPECT_TRUE(out.probe_ran) << out.probe_error;
  EXPECT_TRUE(out.custom_code_ran) << out.custom_detail;
  // Nothing was written into the source tree.
  int files = 0;
  for (const auto& e : fs::recursive_directory_iterator(scripts)) files += e.is_regular_file() ? 1 : 0;
  EXPECT_EQ(files, 3);
  fs::permissions(scripts, fs::perms::owner_all);
  kf::fsutil::remove_tree(dir);  // not fs::remove_all: libtorch exports its own, which crashes here
}

// Reference and candidate timed alike: a copy of the reference submitted as ModelNew (the
// task's Model renamed) measures 1.00x. The noise this test allows: the median of the
// per-pair speedups of 15-30 interleaved pairs within 15 % either way (a 2-core machine
// shared with builds), and the speedup reported (the interval's low end when the spread is
// wide) not above 1.15. Against the C++ reference in the evaluator (the protocol run) the
// same copies measured 0.41-0.75x in kf-eval, and 2-3.9x in this test's process, whose
// OpenMP threads spin while they wait (kf-eval's sleep: exec_with_worker_openmp).
TEST(ModelNewTest, CopyOfTheReferenceMeasuresOneX) {
  at::set_num_threads(2);
  for (const std::string name : {"001_relu", "034_linear"}) {
    std::string src = task(name)->source();
    for (const auto& [from, to] : std::vector<std::pair<std::string, std::string>>{{"class Model(", "class ModelNew("},
                                                                                   {"super(Model,", "super(ModelNew,"}})
      for (size_t pos = src.find(from); pos != std::string::npos; pos = src.find(from, pos + to.size()))
        src.replace(pos, from.size(), to);
    modelnew::Options o = options(false);
    o.probe = false;
    o.eval.warmup = 2;
    o.eval.trials = 15;
    o.eval.max_trials = 30;
    o.eval.max_spread = 0.5;
    modelnew::Outcome out = modelnew::evaluate(*task(name), kf::tasks::Backend::CPU, src, o, 7);
    // An environment verdict (the protocol run's C++ reference slowed against its own
    // baseline: this host's load, not the candidate) says nothing about the timing: again.
    // So does a measurement outside the band once: a full suite with a core spun beside
    // the learning tests measured 0.81 (interval 0.55-0.94) once; timing that is not alike
    // misses the band every time, so the claim must hold in one of three.
    const auto outside = [](const modelnew::Outcome& x) {
      return x.result.verdict == Verdict::ok &&
             !(x.alike_speedup > 1 / 1.15 && x.alike_speedup < 1.15 && x.result.speedup < 1.15);
    };
    for (int again = 0; again < 2 && (out.result.cause == Cause::environment || outside(out)); ++again) {
      std::printf("%s: %s (%s); measured again\n", name.c_str(),
                  outside(out) ? "outside the band" : "environment verdict",
                  outside(out) ? std::to_string(out.alike_speedup).c_str() : out.result.reason.c_str());
      out = modelnew::evaluate(*task(name), kf::tasks::Backend::CPU, src, o, 8 + again);
    }
    const Result& r = out.result;
    ASSERT_EQ(verdict_name(r.verdict), std::string("ok")) << r.reason << "\n" << r.diagnostics;
    std::string alike;
    for (const auto& c : r.checks)
      if (c.name == "modelnew.timing_alike") alike = c.detail;
    std::printf("%s: speedup %.3f [%.3f, %.3f]; %s\n", name.c_str(), r.speedup, r.speedup_lo, r.speedup_hi,
                alike.c_str());
    ASSERT_EQ(alike.rfind("the task's Model in a Python worker", 0), 0u) << alike;
    EXPECT_GT(out.alike_speedup, 1 / 1.15) << alike;
    EXPECT_LT(out.alike_speedup, 1.15) << alike;
    EXPECT_LT(r.speedup, 1.15) << alike;
  }
}

// A model of hundreds of tensors (KernelBench level 3: ResNet, DenseNet, MobileNet) fits the
// sandbox protocol: a task of 560 parameter and buffer tensors, imported here, and a
// ModelNew copy of it verified ok.
TEST(ModelNewTest, ModelWithHundredsOfTensorsFitsTheProtocol) {
  const char* src_env = std::getenv("KF_SOURCE_DIR");
  const std::string src_dir = src_env && *src_env ? src_env : KF_SOURCE_DIR_DEFAULT;
  const std::string dir = temp_dir("kf-mn-deep");
  const std::string cmd = "'" + src_dir + "/tools/import-tasks' '" + std::string(KF_MN_CANDIDATES) +
                          "/tasks/deep_bn_mlp.py' --out '" + dir + "/tasks' --backends cpu > '" + dir +
                          "/import.log' 2>&1";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << slurp(dir + "/import.log");
  auto t = kf::tasks::Task::load(dir + "/tasks/deep_bn_mlp");
  ASSERT_GT(t->inputs(kf::tasks::Backend::CPU).size() + t->params(kf::tasks::Backend::CPU).size(), 500u);
  at::set_num_threads(2);
  modelnew::Options o = options(false);
  modelnew::Outcome out = modelnew::evaluate(*t, kf::tasks::Backend::CPU, read("cpu/deep_bn_mlp_torch.py"), o, 1);
  EXPECT_EQ(verdict_name(out.result.verdict), std::string("ok")) << out.result.reason << "\n" << out.result.diagnostics;
  EXPECT_TRUE(out.probe_ran) << out.probe_error;
  EXPECT_EQ(out.kb_correct, out.kb_trials);
  kf::fsutil::remove_tree(dir);  // not fs::remove_all: libtorch exports its own, which crashes here
}

// kf-evaluator's dispatch: a run's candidate queue holding KernelBench-format sources and
// an ABI kernel, scored by EvaluatorService with the hook kf-evaluator installs and the
// settings of configs/kernelbench.yaml (on the CPU backend and this build's tasks).
TEST(ModelNewTest, EvaluatorServiceScoresKernelBenchCandidatesWithTheKernelbenchConfig) {
  const char* src_env = std::getenv("KF_SOURCE_DIR");
  const std::string src_dir = src_env && *src_env ? src_env : KF_SOURCE_DIR_DEFAULT;
  const kf::Config cfg =
      kf::Config::load(src_dir + "/configs/kernelbench.yaml",
                       {"run.backend=cpu", "tasks.dir=" + build_dir() + "/tasks", "evaluator.trials=3",
                        "evaluator.warmup=1", "evaluator.correctness_sets=2", "evaluator.cpu_threads=2",
                        "evaluator.max_spread=100", "evaluator.min_call_timeout_s=5",
                        // the reference-baseline check has its own test; ctest -j2 on 2 cores
                        // slowed the reference 4-6x against its baseline here
                        "evaluator.ref_slowdown_limit=20"});
  EvalOptions eo = eval_options(cfg);
  eo.compile.cache_dir = build_dir() + "/evaluator-test-cache";
  ServiceOptions so = service_options(cfg);
  ASSERT_EQ(so.backend, kf::tasks::Backend::CPU);
  at::set_num_threads(2);
  const std::string run = "kft" + std::to_string(getpid()) + ".mnsvc";
  auto shm = kf::replay::RunShm::create(run);
  Evaluator ev(eo);
  modelnew::Options mo;
  mo.eval = eo;
  modelnew::install_in_service(so, ev, mo);
  auto source = kf::replay::shm_candidates(*shm, "evaluator 0");
  EvaluatorService service(ev, *source, &shm->control(), so);
  std::vector<kf::replay::Candidate> cands;
  const std::vector<std::string> sources = {read("cpu/good_relu_inline.py"), read("cpu/cached_result_relu.py"),
                                            slurp(std::string(KF_KERNELS_DIR) + "/cpu/good_relu.cpp")};
  for (size_t i = 0; i < sources.size(); ++i) {
    kf::replay::Candidate c;
    c.id = 501 + i;
    c.task = "001_relu";
    c.group_id = 91;
    c.index_in_group = uint32_t(i);
    c.source = sources[i];
    c.completion_tokens = {1, 2};
    c.behaviour_logprobs = {-0.1f, -0.2f};
    cands.push_back(c);
  }
  kf::replay::GroupPublish g;  // as an actor publishes a group (the seam)
  g.candidates = cands;
  g.deadline = std::chrono::minutes(30);
  ASSERT_EQ(kf::replay::shm_groups(*shm, "test actor")->publish(g, std::chrono::seconds(1), [] { return true; }),
            kf::replay::PublishOutcome::published);
  std::size_t scored = 0;
  for (int i = 0; i < 20 && scored < cands.size(); ++i) scored += service.step();
  ASSERT_EQ(scored, cands.size());
  std::vector<kf::replay::ScoredGroup> groups;
  shm->replay().take_ready(groups, 4, 0, 1000, std::chrono::milliseconds(100));
  ASSERT_EQ(groups.size(), 1u);
  std::map<uint64_t, kf::replay::Result> by_id;
  for (size_t i = 0; i < groups[0].results.size(); ++i) by_id[groups[0].results[i].candidate_id] = groups[0].results[i];
  EXPECT_EQ(by_id[501].verdict, kf::replay::Verdict::ok) << by_id[501].reason;
  EXPECT_GT(by_id[501].speedup, 0);
  EXPECT_EQ(by_id[502].verdict, kf::replay::Verdict::rejected_cheat) << by_id[502].reason;
  EXPECT_NE(std::string(by_id[502].reason).find("cached"), std::string::npos) << by_id[502].reason;
  EXPECT_EQ(by_id[503].verdict, kf::replay::Verdict::ok) << by_id[503].reason;  // the ABI path, as before
  EXPECT_LT(by_id[502].reward, by_id[501].reward);
  kf::replay::RunShm::remove(run);
}

// Which sources kf-evaluator sends down the ModelNew path.
TEST(ModelNewTest, KernelBenchSourcesAreToldFromAbiKernels) {
  EXPECT_TRUE(modelnew::is_modelnew_source(read("cpu/good_relu_inline.py")));
  EXPECT_TRUE(modelnew::is_modelnew_source("from torch import nn\nclass ModelNew(nn.Module):  # x\n  pass\n"));
  EXPECT_FALSE(modelnew::is_modelnew_source(slurp(std::string(KF_KERNELS_DIR) + "/cpu/good_relu.cpp")));
  EXPECT_FALSE(modelnew::is_modelnew_source("// import torch\nclass ModelNew : public Base {\n};\n"));
  EXPECT_FALSE(modelnew::is_modelnew_source("import torch\nclass Model(torch.nn.Module):\n  pass\n"));
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
