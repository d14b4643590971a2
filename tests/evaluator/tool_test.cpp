// tools/eval (kf-eval): report formats and exit codes.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "kf/common/config.h"
#include "kf/common/error.h"
#include "kf/evaluator/evaluator.h"
#include "test_util.h"

namespace {
std::string build_dir() {
  const char* e = std::getenv("KF_BUILD_DIR");
  return e && *e ? e : KF_BUILD_DIR_DEFAULT;
}
int run(const std::string& args, std::string* out, const std::string& max_spread = "100") {
  const std::string cmd = std::string(KF_EVAL_BIN) + " " + args + " --tasks " + build_dir() + "/tasks --cache " +
                          build_dir() + "/evaluator-test-cache --threads 2 --trials 3 --warmup 1 --max-spread " +
                          max_spread + " --max-trials 8 2>/dev/null";
  FILE* p = popen(cmd.c_str(), "r");
  char buf[4096];
  out->clear();
  while (size_t n = fread(buf, 1, sizeof buf, p)) out->append(buf, n);
  const int st = pclose(p);
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}
std::string kernel(const std::string& rel) { return kf::evaluator::test::kernels_dir() + "/" + rel; }
}  // namespace

TEST(EvalToolTest, GoodKernelExitsZeroWithJsonReport) {
  std::string out;
  ASSERT_EQ(run("001_relu " + kernel("cpu/good_relu.cpp") + " --json", &out), 0) << out;
  auto j = nlohmann::json::parse(out);
  EXPECT_EQ(j["verdict"], "ok");
  EXPECT_GT(j["speedup"].get<double>(), 0);
  EXPECT_TRUE(j["checks"].is_array());
}

// --check-seed replays a verification: the seed recorded in anti.check_plan gives the same
// checks in the same order; a value that is not a nonzero number is a usage error (2).
TEST(EvalToolTest, CheckSeedReplaysTheChecksAndRejectsGarbage) {
  auto plan = [](const std::string& out) {
    std::vector<std::string> v;
    for (const auto& c : nlohmann::json::parse(out)["checks"]) {
      std::string d = c["detail"];
      d = d.substr(0, d.rfind(" [at "));
      if (c["name"].get<std::string>().rfind("timing.", 0) == 0 || c["name"] == "anti.timer" ||
          c["name"].get<std::string>().rfind("env.", 0) == 0 || c["name"] == "anti.before_clock" ||
          c["name"] == "anti.after_return")
        continue;  // measured figures, not the plan
      v.push_back(c["name"].get<std::string>() + ": " + d);
    }
    return v;
  };
  std::string a, b, bad;
  const std::string args = "001_relu " + kernel("cpu/good_relu.cpp") + " --json --check-seed 0x5a11c0de5eed0001";
  ASSERT_EQ(run(args, &a), 0) << a;
  ASSERT_EQ(run(args, &b), 0) << b;
  EXPECT_NE(a.find("secret seed 0x5a11c0de5eed0001 (given)"), std::string::npos) << a;
  EXPECT_EQ(plan(a), plan(b));
  EXPECT_EQ(run("001_relu " + kernel("cpu/good_relu.cpp") + " --check-seed zz", &bad), 2);
}

// The speedup comes with its 95 % interval from the paired trials, in the text and the
// JSON; a timing flagged unstable reports its conservative estimate, the lower bound.
TEST(EvalToolTest, ReportsTheSpeedupInterval) {
  std::string out;
  ASSERT_EQ(run("001_relu " + kernel("cpu/good_relu.cpp") + " --json", &out), 0) << out;
  auto j = nlohmann::json::parse(out);
  const double s = j["speedup"].get<double>(), lo = j["speedup_lo"].get<double>(), hi = j["speedup_hi"].get<double>();
  EXPECT_GT(lo, 0) << out;
  EXPECT_LE(lo, s) << out;
  EXPECT_LE(s, hi) << out;
  EXPECT_DOUBLE_EQ(j["speedup_confidence"].get<double>(), 0.95);
  EXPECT_TRUE(j["speed_rewarded"].get<bool>());
  EXPECT_FALSE(j["timing_unstable"].get<bool>()) << out;  // --max-spread 100
  ASSERT_EQ(run("001_relu " + kernel("cpu/good_relu.cpp"), &out), 0) << out;
  const auto at = out.find("speedup    ");
  ASSERT_NE(at, std::string::npos) << out;
  const std::string line = out.substr(at, out.find('\n', at) - at);
  EXPECT_NE(line.find("x (95 % "), std::string::npos) << line;
  EXPECT_NE(line.find("\xe2\x80\x93"), std::string::npos) << line;  // lo–hi
  EXPECT_EQ(out.find("timing unstable"), std::string::npos) << out;

  // No spread is small enough: still ok, flagged, and the speedup is the lower bound.
  ASSERT_EQ(run("001_relu " + kernel("cpu/good_relu.cpp") + " --json", &out, "1e-9"), 0) << out;
  j = nlohmann::json::parse(out);
  EXPECT_EQ(j["verdict"], "ok") << out;
  EXPECT_TRUE(j["timing_unstable"].get<bool>()) << out;
  EXPECT_DOUBLE_EQ(j["speedup"].get<double>(), j["speedup_lo"].get<double>()) << out;
  ASSERT_EQ(run("001_relu " + kernel("cpu/good_relu.cpp"), &out, "1e-9"), 0) << out;
  EXPECT_NE(out.find("timing unstable: conservative estimate"), std::string::npos) << out;
}

TEST(EvalToolTest, RejectedKernelExitsOneWithReadableReport) {
  std::string out;
  EXPECT_EQ(run("001_relu " + kernel("cpu/cheat_partial.cpp"), &out), 1) << out;
  EXPECT_NE(out.find("verdict    rejected_cheat"), std::string::npos) << out;
  EXPECT_NE(out.find("not fully written"), std::string::npos) << out;
}

TEST(EvalToolTest, UsageErrorsExitTwo) {
  std::string out;
  EXPECT_EQ(run("", &out), 2);
  EXPECT_EQ(run("no_such_task " + kernel("cpu/good_relu.cpp"), &out), 2);
  EXPECT_EQ(run("001_relu /no/such/kernel.cpp", &out), 2);
  EXPECT_EQ(run("001_relu " + kernel("cpu/good_relu.cpp") + " --backend tpu", &out), 2);
}

TEST(EvalOptionsTest, ConfigKeysReachTheOptionsAndBadValuesNameTheKey) {
  const kf::Config c =
      kf::Config::parse("run:\n  seed: 7\nevaluator:\n  trials: 12\n  reward:\n    kind: log_speedup\n", "test.yaml",
                        {"evaluator.cuda_arch=sm_100"});
  const kf::evaluator::EvalOptions o = kf::evaluator::eval_options(c);
  EXPECT_EQ(o.seed, 7u);
  EXPECT_EQ(o.trials, 12);
  EXPECT_EQ(o.reward.kind, "log_speedup");
  EXPECT_EQ(o.compile.cuda_arch, "sm_100");
  EXPECT_EQ(o.correctness_sets, 3);  // schema default
  try {
    kf::evaluator::eval_options(kf::Config::parse("evaluator:\n  trials: 5\n  max_trials: 2\n", "bad.yaml"));
    FAIL() << "expected kf::Error";
  } catch (const kf::Error& e) {
    EXPECT_NE(std::string(e.what()).find("bad.yaml"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("evaluator.max_trials"), std::string::npos) << e.what();
  }
}
