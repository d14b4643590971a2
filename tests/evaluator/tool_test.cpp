// tools/eval (kf-eval): report formats and exit codes.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>

#include "kf/common/config.h"
#include "kf/common/error.h"
#include "kf/evaluator/evaluator.h"
#include "test_util.h"

namespace {
std::string build_dir() {
  const char* e = std::getenv("KF_BUILD_DIR");
  return e && *e ? e : KF_BUILD_DIR_DEFAULT;
}
int run(const std::string& args, std::string* out) {
  const std::string cmd = std::string(KF_EVAL_BIN) + " " + args + " --tasks " + build_dir() + "/tasks --cache " +
                          build_dir() + "/evaluator-test-cache --threads 2 --trials 3 --warmup 1 --max-spread 100 --max-trials 8 2>/dev/null";
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
  const kf::Config c = kf::Config::parse("run:\n  seed: 7\nevaluator:\n  trials: 12\n  reward:\n    kind: log_speedup\n",
                                         "test.yaml", {"evaluator.cuda_arch=sm_100"});
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
