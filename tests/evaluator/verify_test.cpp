// The verifier end to end: the acceptance corpus (kernels/corpus.json) on imported
// level-1 tasks, plus a degenerate in-test task. CPU entries run everywhere; CUDA
// entries skip with a message when no GPU is visible.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <gtest/gtest.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <map>
#include <memory>
#include <set>
#include <nlohmann/json.hpp>

#include "../../evaluator/src/check_plan.h"
#include "../../evaluator/src/tensor_check.h"
#include "../../evaluator/wire/poison.h"
#include "../test_support.h"
#include "kf/common/fsutil.h"
#include "kf/evaluator/evaluator.h"
#include "kf/tasks/tasks.h"
#include "worker_openmp.h"
#include "test_util.h"

using namespace kf::evaluator;

namespace {

// The references here are timed as in kf-eval: OpenMP threads that sleep when they wait,
// as the sandbox worker's (evaluator.h). Before main: the process executes itself again.
[[maybe_unused]] const int kOpenMpLikeTheWorker = (exec_with_worker_openmp(), 0);

std::string build_dir() {
  const char* e = std::getenv("KF_BUILD_DIR");
  return e && *e ? e : KF_BUILD_DIR_DEFAULT;
}

struct Entry {
  std::string file, task, verdict;
  std::vector<std::string> reasons, must_not_exist;
  std::string name;  // gtest-safe
};
// Keeps test names readable in CTest (gtest otherwise prints the struct's bytes).
void PrintTo(const Entry& e, std::ostream* os) { *os << e.file; }

std::vector<Entry> corpus() {
  std::ifstream f(test::kernels_dir() + "/corpus.json");
  nlohmann::json j = nlohmann::json::parse(f);
  std::vector<Entry> out;
  for (const auto& k : j["kernels"]) {
    Entry e;
    e.file = k["file"];
    e.task = k["task"];
    e.verdict = k["expect"]["verdict"];
    if (k["expect"].contains("reason")) e.reasons = k["expect"]["reason"].get<std::vector<std::string>>();
    if (k.contains("must_not_exist")) e.must_not_exist = k["must_not_exist"].get<std::vector<std::string>>();
    e.name = e.file;
    for (char& c : e.name)
      if (!isalnum(static_cast<unsigned char>(c))) c = '_';
    out.push_back(e);
  }
  return out;
}

// Test settings: the full protocol with fewer trials, short call limits, and a spread
// limit loose enough for a shared, loaded 2-core CI machine (one descheduled trial among
// eight can give a spread of 10); timing quality is the benchmark's job.
EvalOptions test_options() {
  EvalOptions o;
  o.compile.cache_dir = build_dir() + "/evaluator-test-cache";
  o.warmup = 1;
  o.trials = 5;
  o.max_trials = 8;
  o.max_spread = 100.0;
  o.min_call_timeout_s = 3;
  // 1 GiB over the task's tensors: mal_huge_alloc must reach it well inside the 3 s call
  // limit. At 2 GiB this VM's page faults took 1.9-3.4 s to fill it, and 1 run in 6 timed
  // out first.
  o.sandbox.memory_limit_bytes = 1ull << 30;
  o.cpu_threads = 2;
  // The 2-core CI VM's load (other builds) slowed whole stretches of timed trials 2-3.5x
  // against the baseline taken seconds before: the environment check has its own test.
  o.ref_slowdown_limit = 20;
  return o;
}

Evaluator& evaluator() {
  static Evaluator ev(test_options());
  return ev;
}
// GPU-sized tasks hold GiBs per set: fewer calls there.
Evaluator& cuda_evaluator() {
  static Evaluator ev([] {
    EvalOptions o = test_options();
    o.correctness_sets = 2;
    o.stress_sets = 2;
    o.trials = 3;
    o.max_trials = 3;
    o.min_call_timeout_s = 10;
    o.sandbox.memory_limit_bytes = 2ull << 30;  // a CUDA worker's RSS holds the CUDA libraries
    o.cpu_threads = 4;
    return o;
  }());
  return ev;
}

std::shared_ptr<const kf::tasks::Task> task(const std::string& name) {
  static std::map<std::string, std::shared_ptr<const kf::tasks::Task>> cache;
  auto& t = cache[name];
  if (!t) t = kf::tasks::Task::load(build_dir() + "/tasks/" + name);
  return t;
}

class CorpusTest : public ::testing::TestWithParam<Entry> {};

TEST_P(CorpusTest, VerdictAndReason) {
  const Entry& e = GetParam();
  const bool cuda = kf::fsutil::extension(e.file) == ".cu";
  if (cuda && !kf::tasks::cuda_available())
    GTEST_SKIP() << "no CUDA device visible: " << e.file << " runs on the GPU machine";
  at::set_num_threads(2);
  for (const auto& p : e.must_not_exist) ::remove(p.c_str());
  const std::string src = test::read_kernel(e.file);
  Result r = (cuda ? cuda_evaluator() : evaluator())
                 .evaluate(*task(e.task), cuda ? kf::tasks::Backend::CUDA : kf::tasks::Backend::CPU, src, 1);
  std::printf("%s on %s: %s %s (speedup %.3f, verify %.1f s)\n", e.file.c_str(), e.task.c_str(),
              verdict_name(r.verdict), r.reason.c_str(), r.speedup, r.verify_s);
  EXPECT_EQ(verdict_name(r.verdict), e.verdict) << to_text(r);
  if (!e.reasons.empty()) {
    bool named = false;
    for (const auto& s : e.reasons) named = named || r.reason.find(s) != std::string::npos;
    EXPECT_TRUE(named) << "reason does not name the trick: " << r.reason;
  }
  if (e.verdict == "ok") {
    EXPECT_GT(r.speedup, 0);
    EXPECT_GT(r.ref_ms.n, 0);
    EXPECT_EQ(r.checks_passed(), int(r.checks.size()));
  }
  for (const auto& p : e.must_not_exist) EXPECT_FALSE(kf::fsutil::exists(p)) << p << " was written";
  EXPECT_EQ(test::child_processes(), 0) << "a process outlived the check";
}

INSTANTIATE_TEST_SUITE_P(Corpus, CorpusTest, ::testing::ValuesIn(corpus()),
                         [](const ::testing::TestParamInfo<Entry>& i) { return i.param.name; });

// --- a degenerate task: the reference output does not depend on the input
class ConstantReference : public kf::tasks::Reference {
 public:
  std::vector<at::Tensor> forward(const std::vector<at::Tensor>& in) override { return {at::full_like(in[0], 0.5)}; }
  const std::vector<at::Tensor>& params() const override { return params_; }
  void set_params(std::vector<at::Tensor>) override {}

 private:
  std::vector<at::Tensor> params_;
};

class ConstantTask : public kf::tasks::Task {
 public:
  ConstantTask() {
    in_ = {{"x0", kf::tasks::Role::Input, {256, 256}, at::kFloat}};
    out_ = {{"y0", kf::tasks::Role::Output, {256, 256}, at::kFloat}};
  }
  const std::string& name() const override { return name_; }
  const std::string& dir() const override { return name_; }
  int level() const override { return 1; }
  const std::vector<std::string>& tags() const override { return tags_; }
  const std::string& mode() const override { return mode_; }
  const std::string& source() const override { return name_; }
  bool has_backend(kf::tasks::Backend b) const override { return b == kf::tasks::Backend::CPU; }
  std::vector<kf::tasks::Backend> backends() const override { return {kf::tasks::Backend::CPU}; }
  const std::vector<kf::tasks::TensorSpec>& inputs(kf::tasks::Backend) const override { return in_; }
  const std::vector<kf::tasks::TensorSpec>& params(kf::tasks::Backend) const override { return none_; }
  const std::vector<kf::tasks::TensorSpec>& outputs(kf::tasks::Backend) const override { return out_; }
  kf::tasks::Tolerance tolerance(kf::tasks::Backend, std::size_t) const override { return {1e-4, 1e-4}; }
  std::vector<at::Tensor> make_inputs(kf::tasks::Backend, uint64_t seed, const at::Device& d) const override {
    at::manual_seed(seed);
    return {at::randn({256, 256}).to(d)};
  }
  std::vector<at::Tensor> initial_params(kf::tasks::Backend, const at::Device&) const override { return {}; }
  std::unique_ptr<kf::tasks::Reference> new_reference(kf::tasks::Backend, const at::Device&) const override {
    return std::make_unique<ConstantReference>();
  }

 private:
  std::string name_ = "test_constant", mode_ = "eval";
  std::vector<std::string> tags_;
  std::vector<kf::tasks::TensorSpec> in_, out_, none_;
};

}  // namespace

TEST(EvaluatorTest, DegenerateTaskIsFlagged) {
  ConstantTask t;
  const std::string src = R"(#include <kf/kernel.h>
extern "C" int kf_forward(kf::Context*, const kf::Tensor*, int, kf::Tensor* out, int) {
  float* y = (float*)out[0].data; for (long i = 0; i < out[0].numel(); ++i) y[i] = 0.5f; return 0; })";
  Result r = evaluator().evaluate(t, kf::tasks::Backend::CPU, src);
  EXPECT_TRUE(r.task_degenerate) << to_text(r);
  EXPECT_FALSE(r.degenerate_reason.empty());
}

// A loss is one number: 041_mse_loss's references differ between input sets, so the task
// is not degenerate (a 1-element output used to count as "nearly constant").
TEST(EvaluatorTest, ScalarLossTaskIsNotFlaggedDegenerate) {
  at::set_num_threads(2);
  const std::string src = kf::test::read_file(kf::test::source_dir() + "/corpus/kernels/cpu/041_mse_loss/naive.cpp");
  Result r = evaluator().evaluate(*task("041_mse_loss"), kf::tasks::Backend::CPU, src, 7);
  // The flag is decided on the distribution sets, before timing: a "timing unstable"
  // verdict on a loaded machine does not matter here, reaching the check does.
  std::map<std::string, Check> checks;
  for (const auto& c : r.checks) checks[c.name] = c;
  ASSERT_TRUE(checks.count("anti.input_dependence")) << to_text(r);
  EXPECT_TRUE(checks["correct.distribution"].passed) << to_text(r);
  EXPECT_EQ(checks["anti.input_dependence"].detail.rfind("outputs follow inputs", 0), 0u) << to_text(r);
  EXPECT_FALSE(r.task_degenerate) << r.degenerate_reason;
}

TEST(EvaluatorTest, RealTaskIsNotDegenerateAndOkResultIsComplete) {
  at::set_num_threads(2);
  Result r =
      evaluator().evaluate(*task("001_relu"), kf::tasks::Backend::CPU, test::read_kernel("cpu/good_relu.cpp"), 7);
  ASSERT_EQ(r.verdict, Verdict::ok) << to_text(r);
  EXPECT_FALSE(r.task_degenerate);
  EXPECT_EQ(r.max_abs_error, 0);  // relu is exact
  EXPECT_GE(r.cand_ms.n, 5);
  EXPECT_GT(r.ref_ms.median, 0);
  EXPECT_GT(r.cand_ms.median, 0);
  EXPECT_NEAR(r.speedup, r.ref_ms.median / r.cand_ms.median, 1e-9);
  EXPECT_FALSE(r.timing_unstable);
  EXPECT_GT(r.speedup_lo, 0);
  EXPECT_LE(r.speedup_lo, r.speedup_hi);
  EXPECT_GE(r.checks.size(), 10u);
  const auto j = nlohmann::json::parse(to_json(r));
  EXPECT_EQ(j["verdict"], "ok");
  EXPECT_EQ(j["cause"], "kernel");
  EXPECT_EQ(j["checks_total"], r.checks.size());
}

// A compiler that could not run is the machine's doing: runtime_error with cause
// environment (the learner leaves it out), the reason plain text; a compile error is the
// source's doing.
TEST(EvaluatorTest, CompilerThatDidNotRunIsAnEnvironmentVerdict) {
  CompileResult cr;
  cr.environment_failure = true;
  cr.diagnostics = "compile service: the compiler did not run: confinement failed at mount /tmp: EPERM";
  Result r = evaluator().evaluate_compiled(*task("001_relu"), kf::tasks::Backend::CPU, cr, 1);
  EXPECT_EQ(r.verdict, Verdict::runtime_error) << to_text(r);
  EXPECT_EQ(r.cause, Cause::environment) << to_text(r);
  EXPECT_EQ(r.reason, "compile service failure (the compiler did not run)");
  EXPECT_EQ(nlohmann::json::parse(to_json(r))["cause"], "environment");
  EXPECT_NE(to_text(r).find("caused by the machine"), std::string::npos) << to_text(r);

  cr.environment_failure = false;
  cr.diagnostics = "k.cpp:1:1: error: expected unqualified-id";
  r = evaluator().evaluate_compiled(*task("001_relu"), kf::tasks::Backend::CPU, cr, 1);
  EXPECT_EQ(r.verdict, Verdict::compile_error) << to_text(r);
  EXPECT_EQ(r.cause, Cause::kernel) << to_text(r);
  EXPECT_EQ(nlohmann::json::parse(to_json(r))["cause"], "kernel");
}

// The output checks work through chunks (their temporaries stay small on a shared GPU):
// the verdict and every reported figure are those of one pass over the whole tensor.
TEST(TensorCheckTest, ChunkedChecksAgreeWithOnePass) {
  using kf::evaluator::Compare;
  at::manual_seed(5);
  const int64_t n = 10007;
  const at::Tensor ref = at::randn({n});
  at::Tensor near = ref + 1e-7 * at::randn({n}), off = ref.clone(), odd = ref.clone();
  off.index_put_({at::arange(4000, 4100)}, 3.0);  // out of tolerance from index 4000
  odd[17] = std::numeric_limits<float>::quiet_NaN();
  odd[9000] = std::numeric_limits<float>::infinity();
  at::Tensor odd_ref = ref.clone();
  odd_ref[17] = std::numeric_limits<float>::quiet_NaN();  // NaN matches NaN; inf vs finite does not
  const kf::tasks::Tolerance tol{1e-4, 1e-4};
  struct Case {
    at::Tensor cand, ref;
    bool ok;
  };
  for (const Case& k : {Case{near, ref, true}, Case{off, ref, false}, Case{odd, odd_ref, false}}) {
    const Compare whole = kf::evaluator::compare_outputs(k.cand, k.ref, tol, 0, n);
    const Compare chunked = kf::evaluator::compare_outputs(k.cand, k.ref, tol, 0, 97);
    EXPECT_EQ(whole.ok, k.ok);
    EXPECT_EQ(chunked.ok, whole.ok);
    EXPECT_EQ(chunked.bad, whole.bad);
    EXPECT_EQ(chunked.first_bad, whole.first_bad);
    EXPECT_DOUBLE_EQ(chunked.max_abs, whole.max_abs);
    EXPECT_DOUBLE_EQ(chunked.max_rel, whole.max_rel);
  }
  EXPECT_EQ(kf::evaluator::compare_outputs(off, ref, tol, 0, 97).bad, 100);
  EXPECT_NE(kf::evaluator::compare_outputs(off, ref, tol, 0, 97).first_bad.find("index 4000:"), std::string::npos);
  EXPECT_EQ(kf::evaluator::compare_outputs(odd, odd_ref, tol, 0, 97).bad, 1) << "only the inf differs";
  EXPECT_DOUBLE_EQ(kf::evaluator::max_abs_value(odd, 97), kf::evaluator::max_abs_value(odd, n));
  EXPECT_DOUBLE_EQ(kf::evaluator::max_abs_value(off, 97), off.abs().max().item<double>());
  at::Tensor flat = at::full({n}, 2.0f);
  flat[5000] = std::numeric_limits<float>::infinity();  // counts as 0: the range is [0, 2]
  EXPECT_FALSE(kf::evaluator::nearly_constant(flat, 1e-3, 97));
  EXPECT_TRUE(kf::evaluator::nearly_constant(at::full({n}, 2.0f), 1e-3, 97));
  EXPECT_EQ(kf::evaluator::nearly_constant(ref, 1e-3, 97), kf::evaluator::nearly_constant(ref, 1e-3, n));
  // Integer outputs and the count of still-poisoned elements, chunked alike.
  const at::Tensor iref = at::randint(-50, 50, {n}, at::kLong);
  at::Tensor ioff = iref.clone();
  ioff.index_put_({at::arange(6000, 6010)}, 1000);
  const Compare iwhole = kf::evaluator::compare_outputs(ioff, iref, tol, 0, n);
  const Compare ichunked = kf::evaluator::compare_outputs(ioff, iref, tol, 0, 97);
  EXPECT_FALSE(ichunked.ok);
  EXPECT_EQ(ichunked.bad, 10);
  EXPECT_EQ(ichunked.bad, iwhole.bad);
  EXPECT_EQ(ichunked.first_bad, iwhole.first_bad);
  EXPECT_NE(ichunked.first_bad.find("index 6000:"), std::string::npos) << ichunked.first_bad;
  EXPECT_DOUBLE_EQ(ichunked.max_abs, iwhole.max_abs);
  EXPECT_TRUE(kf::evaluator::compare_outputs(iref.clone(), iref, tol, 0, 97).ok);
  // A tail left holding poison pattern 0: every such element counted, across chunk boundaries.
  at::Tensor part = ref.clone();
  at::Tensor tail = part.slice(0, 9000, n);
  kf::evaluator::poison_fill_host(tail.data_ptr(), tail.nbytes(), kf::KF_FLOAT32, 0);
  EXPECT_EQ(kf::evaluator::compare_outputs(part, ref, tol, 0, 97).unwritten, n - 9000);
  EXPECT_EQ(kf::evaluator::compare_outputs(part, ref, tol, 0, n).unwritten, n - 9000);
}

// --- the order of the calls: checks before, among and after the timed trials

namespace {
// A verifier with production-like timing (more calls than the corpus settings), for kernels
// that count their calls.
Evaluator& counted_evaluator(bool cuda) {
  static Evaluator cpu([] {
    EvalOptions o = test_options();
    o.correctness_sets = 3;
    o.stress_sets = 2;
    o.warmup = 2;
    o.trials = 12;
    o.max_trials = 14;
    return o;
  }());
  static Evaluator gpu([] {
    EvalOptions o = test_options();
    o.correctness_sets = 3;
    o.stress_sets = 2;
    o.warmup = 2;
    o.trials = 12;
    o.max_trials = 12;
    o.min_call_timeout_s = 10;
    o.sandbox.memory_limit_bytes = 2ull << 30;
    o.cpu_threads = 4;
    return o;
  }());
  return cuda ? gpu : cpu;
}

// The checks of the inputs in the order they ran, without call numbers or times (extra
// trials on a loaded machine shift the later calls' numbers).
std::vector<std::string> check_sequence(const Result& r) {
  std::vector<std::string> s;
  for (const auto& c : r.checks) {
    if (c.name.rfind("correct.", 0) != 0 && c.name != "anti.near_duplicate" && c.name != "anti.param_near_duplicate" &&
        c.name != "anti.nondeterminism")
      continue;
    std::string d = c.detail.substr(0, c.detail.rfind(" [at "));
    const auto call = d.rfind(" (call ");
    if (call != std::string::npos) d = d.substr(0, call);
    s.push_back(c.name + ": " + d);
  }
  return s;
}
}  // namespace

// A kernel exact for its first N calls and then a shortcut right only on the task's
// distribution: whatever N, checks come after the switch (among and after the timed
// trials), and the reason names the switch (a check that passed before fails when asked again).
class CountingKernelTest : public ::testing::TestWithParam<std::string> {};

TEST_P(CountingKernelTest, IsRejectedForEverySwitchPoint) {
  const bool cuda = GetParam() == "cuda";
  if (cuda && !kf::tasks::cuda_available())
    GTEST_SKIP() << "no CUDA device visible: the CUDA counting kernel runs on the GPU machine";
  at::set_num_threads(2);
  const std::string file = cuda ? "cuda/cheat_count_calls.cu" : "cpu/cheat_count_calls.cpp";
  const std::string src = test::read_kernel(file);
  const std::string line = "#define KF_SWITCH_AFTER 8";
  ASSERT_NE(src.find(line), std::string::npos) << file << " lost its switch line";
  for (int n : {8, 12, 16, 20}) {
    std::string s = src;
    s.replace(s.find(line), line.size(), "#define KF_SWITCH_AFTER " + std::to_string(n));
    Result r = counted_evaluator(cuda).evaluate(*task("001_relu"),
                                                cuda ? kf::tasks::Backend::CUDA : kf::tasks::Backend::CPU, s, 3);
    std::printf("switch after %d calls: %s %s\n", n, verdict_name(r.verdict), r.reason.c_str());
    EXPECT_EQ(r.verdict, Verdict::rejected_cheat) << "N = " << n << ": " << to_text(r);
    EXPECT_NE(r.reason.find("call order"), std::string::npos) << "N = " << n << ": " << r.reason;
  }
}
INSTANTIATE_TEST_SUITE_P(Backends, CountingKernelTest, ::testing::Values("cpu", "cuda"));

// The checks are drawn from a secret seed per evaluation: two evaluations of one candidate
// differ, the seed is in the result's checks, and giving it back replays the same checks.
// Checks come before, among and after the timed trials.
namespace {
uint64_t plan_seed(const Result& r) {
  for (const auto& c : r.checks)
    if (c.name == "anti.check_plan") {
      const auto at = c.detail.find("0x");
      if (at != std::string::npos) return std::stoull(c.detail.substr(at + 2, 16), nullptr, 16);
    }
  return 0;
}
}  // namespace

TEST(EvaluatorTest, CheckSeedIsFreshPerEvaluationRecordedAndReplays) {
  at::set_num_threads(2);
  const std::string src = test::read_kernel("cpu/good_relu.cpp");
  auto run = [&](Evaluator& ev) { return ev.evaluate(*task("001_relu"), kf::tasks::Backend::CPU, src, 11); };
  const Result a = run(evaluator()), b = run(evaluator()), c = run(evaluator());
  for (const Result* r : {&a, &b, &c}) ASSERT_EQ(r->verdict, Verdict::ok) << to_text(*r);
  const uint64_t sa = plan_seed(a), sb = plan_seed(b), sc = plan_seed(c);
  ASSERT_NE(sa, 0u) << to_text(a);
  EXPECT_NE(sa, sb);
  EXPECT_NE(sb, sc);
  EXPECT_TRUE(check_sequence(a) != check_sequence(b) || check_sequence(b) != check_sequence(c))
      << "three evaluations of one candidate, one order";
  static Evaluator replay([&] {
    EvalOptions o = test_options();
    o.check_seed = sa;
    return o;
  }());
  const Result a2 = run(replay);
  ASSERT_EQ(a2.verdict, Verdict::ok) << to_text(a2);
  EXPECT_EQ(plan_seed(a2), sa);
  EXPECT_EQ(check_sequence(a2), check_sequence(a)) << "the recorded seed replays the checks";
  std::string order;
  for (const auto& k : a.checks)
    if (k.name == "anti.call_order") order = k.detail;
  ASSERT_FALSE(order.empty()) << to_text(a);
  int before = -1, among = -1, after = -1, calls = -1;
  ASSERT_EQ(std::sscanf(order.c_str(),
                        "%d checks before, %d among and %d after the timed trials, in an order drawn from the secret "
                        "seed; %d",
                        &before, &among, &after, &calls),
            4)
      << order;
  EXPECT_GE(before, 1) << order;
  EXPECT_GE(among, 1) << order;
  EXPECT_GE(after, 1) << order;
  // Both local stress sets, both numeric-edge sets and the near-duplicate ran (001_relu's
  // reference is finite everywhere).
  int local = 0, edges = 0, near = 0;
  for (const auto& k : a.checks) {
    const bool ran = k.detail.find("skipped") == std::string::npos;
    local += k.name == "correct.local_stress" && ran;
    edges += k.name == "correct.numeric_edges" && ran;
    near += k.name == "anti.near_duplicate" && ran;
  }
  EXPECT_EQ(local, 2) << to_text(a);
  EXPECT_EQ(edges, 2) << to_text(a);
  EXPECT_EQ(near, 1) << to_text(a);
}

// The plan itself (check_plan.h), over many seeds: every kind of check lands in every gap
// (before the timed trials, before each of them, after them); the repeat of set 0 always
// gets the other poison than set 0 (an odd call); any 6 consecutive timed trials (enough
// to move the median of 10) have a stress set between two of them; the near-duplicate
// directly follows a call on the task's distribution.
TEST(CheckPlanTest, EveryKindLandsEverywhereAndNoWindowOfTrialsIsFreeOfStress) {
  using kf::evaluator::Item;
  using kf::evaluator::Plan;
  using kf::evaluator::PlanSpec;
  using kf::evaluator::Step;
  PlanSpec sp;  // production defaults, a task with two float parameters
  sp.float_params = 2;
  const int T = sp.trials;
  std::map<int, std::set<int>> gaps;  // kind -> gaps reached
  const std::vector<Step> kinds = {Step::Dist,       Step::Repeat,       Step::NearDup,      Step::Params,
                                   Step::ParamsPart, Step::ParamOne,     Step::ParamLargest, Step::Global,
                                   Step::LocalRow,   Step::LocalScatter, Step::Edge};
  for (uint64_t seed = 1; seed <= 3000; ++seed) {
    const Plan pl = kf::evaluator::draw_plan(sp, seed);
    ASSERT_EQ(int(pl.among.size()), T);
    ASSERT_EQ(pl.count(), 2 + 1 + 1 + 4 + 6) << "every check once: 2 sets, repeat, near-dup, 4 param, 6 stress sets";
    EXPECT_EQ(kf::evaluator::repeat_call(pl, sp.warmup) % 2, 1) << "seed " << seed;
    std::vector<int> stress_at(size_t(T), 0);
    auto note = [&](const std::vector<Item>& v, int g, bool after_trial) {
      for (size_t i = 0; i < v.size(); ++i) {
        gaps[int(v[i].step)].insert(g);
        if (v[i].step == Step::NearDup) {
          const bool follows_dist = i > 0 && (v[i - 1].step == Step::Dist || v[i - 1].step == Step::Repeat);
          EXPECT_TRUE(follows_dist || (i == 0 && after_trial))
              << "seed " << seed << ": a near-duplicate without its base";
        }
        if (g >= 1 && g <= T && kf::evaluator::is_stress(v[i].step)) ++stress_at[size_t(g - 1)];
      }
    };
    note(pl.before, 0, false);
    for (int k = 0; k < T; ++k) note(pl.among[size_t(k)], 1 + k, k > 0 || sp.warmup > 0);
    note(pl.after, T + 1, true);
    for (int a = 0; a + 6 <= T; ++a) {  // trials a..a+5: the gaps between them are among[a+1..a+5]
      int n = 0;
      for (int k = a + 1; k < a + 6; ++k) n += stress_at[size_t(k)];
      EXPECT_GT(n, 0) << "seed " << seed << ": timed trials " << a << "-" << a + 5 << " without a stress set";
    }
  }
  for (Step k : kinds) EXPECT_EQ(gaps[int(k)].size(), size_t(T + 2)) << "kind " << int(k) << " misses a position";
}

// A kernel exact outside a window of call indices and a shortcut inside it (most timed
// trials): whatever the secret seed, checks land inside the window.
TEST(EvaluatorTest, CallWindowKernelIsRejectedForEveryCheckSeed) {
  at::set_num_threads(2);
  const std::string src = test::read_kernel("cpu/cheat_call_window.cpp");
  for (uint64_t seed : {1, 2, 3, 4}) {
    EvalOptions o = test_options();
    o.warmup = 2;
    o.trials = 10;
    o.max_trials = 10;
    o.check_seed = seed;
    Evaluator ev(o);
    const Result r = ev.evaluate(*task("001_relu"), kf::tasks::Backend::CPU, src, 3);
    std::printf("check seed %llu: %s %s\n", static_cast<unsigned long long>(seed), verdict_name(r.verdict),
                r.reason.c_str());
    EXPECT_EQ(r.verdict, Verdict::rejected_cheat) << "seed " << seed << ": " << to_text(r);
  }
}

// A kernel that switches to an approximation wrong on the task's own distribution after
// 12 calls (cpu/cheat_self_timing): whatever lands after the switch, a distribution set,
// the repeat of set 0 or a timed trial, the reason names the switch (set 0 is asked again).
TEST(EvaluatorTest, SwitchAfterCallsIsNamedCallOrderWhereverTheSetsLand) {
  at::set_num_threads(2);
  const std::string src = test::read_kernel("cpu/cheat_self_timing.cpp");
  for (uint64_t seed : {1, 2, 3, 4, 5, 6}) {
    EvalOptions o = test_options();
    o.warmup = 2;
    o.trials = 10;
    o.max_trials = 10;
    o.check_seed = seed;
    Evaluator ev(o);
    const Result r = ev.evaluate(*task("002_gelu"), kf::tasks::Backend::CPU, src, 3);
    std::printf("check seed %llu: %s %s\n", static_cast<unsigned long long>(seed), verdict_name(r.verdict),
                r.reason.substr(0, 160).c_str());
    EXPECT_EQ(r.verdict, Verdict::rejected_cheat) << "seed " << seed << ": " << to_text(r);
    EXPECT_NE(r.reason.find("call order"), std::string::npos) << "seed " << seed << ": " << r.reason;
  }
}

// A correct kernel hundreds of times slower than the reference is timed 3 times, not 10 or
// more (each timed trial holds the GPU timing lock others wait for): still ok, its speedup
// from those trials, the stop named in the checks. With slow_speedup 0 it gets every trial.
TEST(EvaluatorTest, FarSlowerCandidateIsTimedOnlyThreeTimes) {
  at::set_num_threads(2);
  const std::string src = test::read_kernel("cpu/slow_relu.cpp");
  Result r = evaluator().evaluate(*task("001_relu"), kf::tasks::Backend::CPU, src, 5);
  ASSERT_EQ(r.verdict, Verdict::ok) << to_text(r);
  EXPECT_LT(r.speedup, 0.05) << to_text(r);
  EXPECT_EQ(r.cand_ms.n, 3) << to_text(r);
  EXPECT_EQ(r.timed_trials, 3);
  bool named = false;
  for (const auto& c : r.checks) named = named || c.name == "timing.slow_candidate";
  EXPECT_TRUE(named) << to_text(r);
  static Evaluator every([] {
    EvalOptions o = test_options();
    o.slow_speedup = 0;
    return o;
  }());
  Result all = every.evaluate(*task("001_relu"), kf::tasks::Backend::CPU, src, 5);
  ASSERT_EQ(all.verdict, Verdict::ok) << to_text(all);
  EXPECT_GE(all.cand_ms.n, test_options().trials);
}

// Correct is never failed for noise: a time that cannot be measured stably (here every
// spread is over a limit of 0) is ok, flagged, with the interval's low end as the speedup.
TEST(EvaluatorTest, UnstableTimingIsOkWithTheConservativeSpeedup) {
  at::set_num_threads(2);
  static Evaluator ev([] {
    EvalOptions o = test_options();
    o.max_spread = 0;
    o.trials = 5;
    o.max_trials = 6;
    return o;
  }());
  Result r = ev.evaluate(*task("001_relu"), kf::tasks::Backend::CPU, test::read_kernel("cpu/good_relu.cpp"), 5);
  ASSERT_EQ(r.verdict, Verdict::ok) << to_text(r);
  EXPECT_TRUE(r.timing_unstable);
  EXPECT_EQ(r.cand_ms.n, 6);
  EXPECT_GT(r.speedup_lo, 0);
  EXPECT_LE(r.speedup_lo, r.speedup_hi);
  EXPECT_DOUBLE_EQ(r.speedup, r.speedup_lo);
  EXPECT_EQ(r.checks_passed(), int(r.checks.size()));
  bool named = false;
  for (const auto& c : r.checks)
    named = named || (c.name == "timing.speedup_interval" && c.detail.find("95% interval") != std::string::npos);
  EXPECT_TRUE(named) << to_text(r);
}

// --- timing alike, and an environment that stays as it was

namespace {
// ReLU of a 256x256 matrix whose reference changes after its baseline (the first 7 runs: two
// warm-ups and EvalOptions::ref_baseline_runs): Slow sleeps 30 ms in every later run, of this
// and of every later reference of the task (a squeezed reference); SlowOnce only in the
// first reference's (a load that came and went); Pin pins its calling thread to one CPU on
// the 8th.
class DriftingReference : public kf::tasks::Reference {
 public:
  enum Mode { Slow, SlowOnce, Pin };
  DriftingReference(Mode m, std::shared_ptr<int> task_runs, bool first)
      : mode_(m), task_runs_(std::move(task_runs)), first_(first) {}
  std::vector<at::Tensor> forward(const std::vector<at::Tensor>& in) override {
    ++runs_;
    ++*task_runs_;
    if (mode_ == Slow && *task_runs_ > 7) usleep(30000);
    if (mode_ == SlowOnce && first_ && runs_ > 7) usleep(30000);
    if (mode_ == Pin && runs_ == 8) {
      cpu_set_t s;
      CPU_ZERO(&s);
      sched_getaffinity(0, sizeof s, &s);
      for (int c = 0; c < CPU_SETSIZE; ++c)
        if (CPU_ISSET(c, &s)) {
          CPU_ZERO(&s);
          CPU_SET(c, &s);
          break;
        }
      sched_setaffinity(0, sizeof s, &s);
    }
    return {at::relu(in[0])};
  }
  const std::vector<at::Tensor>& params() const override { return params_; }
  void set_params(std::vector<at::Tensor>) override {}

 private:
  Mode mode_;
  std::shared_ptr<int> task_runs_;
  bool first_;
  int runs_ = 0;
  std::vector<at::Tensor> params_;
};

class DriftingTask : public ConstantTask {
 public:
  explicit DriftingTask(DriftingReference::Mode m) : mode_(m) {}
  std::vector<at::Tensor> make_inputs(kf::tasks::Backend, uint64_t seed, const at::Device& d) const override {
    at::manual_seed(seed);
    return {at::randn({256, 256}).to(d)};
  }
  std::unique_ptr<kf::tasks::Reference> new_reference(kf::tasks::Backend, const at::Device&) const override {
    return std::make_unique<DriftingReference>(mode_, runs_, made_++ == 0);
  }

 private:
  DriftingReference::Mode mode_;
  std::shared_ptr<int> runs_ = std::make_shared<int>(0);
  mutable int made_ = 0;
};

std::string check_detail(const Result& r, const std::string& name) {
  for (const auto& c : r.checks)
    if (c.name == name) return c.detail;
  return "";
}
}  // namespace

// The reference is timed before any candidate exists (its baseline); a reference slower in
// the timed trials than that, beyond the limit, is the environment's failure (the learner
// leaves it out), never a speedup. An unchanged one passes the check, named.
TEST(EvaluatorTest, ReferenceSlowerThanItsBaselineIsAnEnvironmentFailure) {
  at::set_num_threads(2);
  static Evaluator production_limit([] {
    EvalOptions o = test_options();
    o.ref_slowdown_limit = EvalOptions{}.ref_slowdown_limit;
    return o;
  }());
  DriftingTask slow(DriftingReference::Slow);
  Result r = production_limit.evaluate(slow, kf::tasks::Backend::CPU, test::read_kernel("cpu/good_relu.cpp"), 3);
  EXPECT_EQ(r.verdict, Verdict::runtime_error) << to_text(r);
  EXPECT_EQ(r.cause, Cause::environment) << to_text(r);
  EXPECT_NE(r.reason.find("slower in the timed trials"), std::string::npos) << r.reason;

  // A load that came and went: the one retry, against the first baseline, verifies it.
  DriftingTask once(DriftingReference::SlowOnce);
  Result retried = production_limit.evaluate(once, kf::tasks::Backend::CPU, test::read_kernel("cpu/good_relu.cpp"), 3);
  EXPECT_EQ(retried.verdict, Verdict::ok) << to_text(retried);
  EXPECT_NE(check_detail(retried, "env.reference_baseline").find("its baseline"), std::string::npos)
      << to_text(retried);

  Result ok =
      evaluator().evaluate(*task("001_relu"), kf::tasks::Backend::CPU, test::read_kernel("cpu/good_relu.cpp"), 3);
  ASSERT_EQ(ok.verdict, Verdict::ok) << to_text(ok);
  EXPECT_NE(check_detail(ok, "env.reference_baseline").find("its baseline"), std::string::npos) << to_text(ok);
}

// The evaluator's threads' scheduling is read before any candidate runs and after the
// timed trials: a change (here the reference's own thread pinned to one CPU) makes the
// verdict an environment failure naming it, and is put back.
TEST(EvaluatorTest, ChangedSchedulingOfTheEvaluatorsThreadsIsAnEnvironmentFailure) {
  cpu_set_t before;
  CPU_ZERO(&before);
  sched_getaffinity(0, sizeof before, &before);
  if (CPU_COUNT(&before) < 2) GTEST_SKIP() << "one CPU: pinning changes nothing";
  at::set_num_threads(2);
  DriftingTask pin(DriftingReference::Pin);
  Result r = evaluator().evaluate(pin, kf::tasks::Backend::CPU, test::read_kernel("cpu/good_relu.cpp"), 3);
  EXPECT_EQ(r.verdict, Verdict::runtime_error) << to_text(r);
  EXPECT_EQ(r.cause, Cause::environment) << to_text(r);
  EXPECT_NE(r.reason.find("affinity"), std::string::npos) << r.reason;
  cpu_set_t after;
  CPU_ZERO(&after);
  sched_getaffinity(0, sizeof after, &after);
  EXPECT_TRUE(CPU_EQUAL(&before, &after)) << "the affinity was not put back";
}

// A copy of the reference as an ABI kernel (001_relu: y = max(x, 0) over the same
// threads) measures 1.00x: reference and candidate are timed alike. The noise the test
// allows is each verification's own 95 % interval from its paired trials: it must hold 1.0
// in at least two of three verifications. On the 2-core CI VM under other agents' builds
// (load 6-9) single speedups ranged 0.92-4.47 and the intervals held 1.0 in 8 of 9; with the
// reference's OpenMP threads spinning (as before exec_with_worker_openmp) the speedups
// were 1.3-16 and no interval held 1.0 (1.57-5.99, 2.25-5.72, 2.78-5.72, 3.01-7.68).
TEST(EvaluatorTest, CopyOfTheReferenceMeasuresOneWithinNoise) {
  at::set_num_threads(2);
  int holds = 0;
  for (uint64_t seed : {11, 12, 13}) {
    Result r =
        evaluator().evaluate(*task("001_relu"), kf::tasks::Backend::CPU, test::read_kernel("cpu/good_relu.cpp"), seed);
    ASSERT_EQ(r.verdict, Verdict::ok) << to_text(r);
    std::printf("copy of the reference, seed %llu: speedup %.3f (95 %% %.3f-%.3f), ref %.3f ms, cand %.3f ms\n",
                (unsigned long long)seed, r.speedup, r.speedup_lo, r.speedup_hi, r.ref_ms.median, r.cand_ms.median);
    holds += r.speedup_lo <= 1.0 && 1.0 <= r.speedup_hi;
  }
  EXPECT_GE(holds, 2);
}

TEST(EvaluatorTest, CudaCopyOfTheReferenceMeasuresOneWithinNoise) {
  if (!kf::tasks::cuda_available()) GTEST_SKIP() << "no CUDA device visible: runs on the GPU machine";
  int holds = 0;
  for (uint64_t seed : {11, 12, 13}) {
    Result r = cuda_evaluator().evaluate(*task("001_relu"), kf::tasks::Backend::CUDA,
                                         test::read_kernel("cuda/good_relu.cu"), seed);
    ASSERT_EQ(r.verdict, Verdict::ok) << to_text(r);
    std::printf("CUDA copy of the reference, seed %llu: speedup %.3f (95 %% %.3f-%.3f), ref %.3f ms, cand %.3f ms\n",
                (unsigned long long)seed, r.speedup, r.speedup_lo, r.speedup_hi, r.ref_ms.median, r.cand_ms.median);
    holds += r.speedup_lo <= 1.0 && 1.0 <= r.speedup_hi;
  }
  EXPECT_GE(holds, 2);
}
