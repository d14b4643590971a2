// Torch-free parts: content hash, timing statistics, reward, result reports.
#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>

#include "../../evaluator/src/sha256.h"
#include "kf/common/error.h"
#include "kf/evaluator/evaluator.h"
#include "reward.h"  // RewardModel
#include "stats.h"   // speedup_of, SpeedupInterval

using namespace kf::evaluator;

TEST(Sha256Test, StandardVectors) {
  EXPECT_EQ(sha256_hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(sha256_hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(sha256_hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  EXPECT_EQ(sha256_hex(std::string(1000000, 'a')), "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

TEST(TimingStatsTest, QuantilesMedianSpread) {
  TimeSummary s = summarize({5, 1, 4, 2, 3});
  EXPECT_EQ(s.n, 5);
  EXPECT_DOUBLE_EQ(s.median, 3);
  EXPECT_DOUBLE_EQ(s.min, 1);
  EXPECT_DOUBLE_EQ(s.max, 5);
  EXPECT_NEAR(s.p10, 1.4, 1e-12);
  EXPECT_NEAR(s.p90, 4.6, 1e-12);
  EXPECT_NEAR(s.spread(), (4.6 - 1.4) / 3, 1e-12);
  EXPECT_DOUBLE_EQ(summarize({2, 4}).median, 3);
  EXPECT_EQ(summarize({}).n, 0);
  EXPECT_DOUBLE_EQ(speedup_of(summarize({10, 10}), summarize({2.5})), 4.0);
}

TEST(TimingStatsTest, SpreadOfNoisyTrialsIsWide) {
  std::vector<double> v;
  for (int i = 0; i < 20; ++i) v.push_back(i % 2 ? 1.0 : 3.0);
  EXPECT_GT(summarize(v).spread(), 0.5);
}

TEST(RewardTest, FailuresAreFixedAndBelowEveryOkScore) {
  RewardModel m;
  for (Verdict v :
       {Verdict::compile_error, Verdict::runtime_error, Verdict::timeout, Verdict::incorrect, Verdict::rejected_cheat})
    EXPECT_LT(m.score(v, 10.0), -2.0) << verdict_name(v);
  EXPECT_LT(m.score(Verdict::rejected_cheat, 0), m.score(Verdict::incorrect, 0));
  // An ok result, however slow, scores above any failure.
  EXPECT_GE(m.score(Verdict::ok, 0.01), -2.0);
}

TEST(RewardTest, CudaL1NormalisesWithRunningStatsAndClips) {
  RewardOptions o;
  o.min_samples = 4;
  o.clip = 2;
  RewardModel m(o);
  // Warm-up: clip(speedup - 1).
  EXPECT_NEAR(m.score(Verdict::ok, 1.5), 0.5, 1e-12);
  m.score(Verdict::ok, 1.0);
  m.score(Verdict::ok, 2.0);
  m.score(Verdict::ok, 1.5);
  EXPECT_EQ(m.samples(), 4);
  const double mean = 1.5, sd = std::sqrt(0.125);
  EXPECT_NEAR(m.running_mean(), mean, 1e-12);
  EXPECT_NEAR(m.score(Verdict::ok, 1.6), (1.6 - mean) / sd, 1e-9);
  EXPECT_DOUBLE_EQ(m.score(Verdict::ok, 0.001), -2.0);  // clipped
  EXPECT_DOUBLE_EQ(m.score(Verdict::ok, 100.0), 2.0);   // clipped
}

// cuda_l1 compares a kernel with its peers on the same task: a task with large speedups
// does not set the scale for another, and scoring one task leaves another's statistics alone.
TEST(RewardTest, CudaL1NormalisesWithinEachTask) {
  RewardOptions o;
  o.min_samples = 4;
  RewardModel m(o);
  for (double s : {9.0, 10.0, 11.0, 10.0}) m.score(Verdict::ok, s, "fast_task");
  for (double s : {0.9, 1.0, 1.1, 1.0}) m.score(Verdict::ok, s, "slow_task");
  EXPECT_EQ(m.samples("fast_task"), 4);
  EXPECT_EQ(m.samples("slow_task"), 4);
  EXPECT_NEAR(m.running_mean("fast_task"), 10.0, 1e-12);
  EXPECT_NEAR(m.running_mean("slow_task"), 1.0, 1e-12);
  const double sd = std::sqrt(0.005);  // of 0.9, 1.0, 1.1, 1.0
  // 1.05x is above its own task's mean: a positive reward (pooled with the fast task it was about -1).
  EXPECT_NEAR(m.score(Verdict::ok, 1.05, "slow_task"), 0.05 / sd, 1e-9);
  EXPECT_NEAR(m.running_mean("fast_task"), 10.0, 1e-12);  // untouched by the other task
  // A task seen for the first time is in its own warm-up: clip(speedup - 1).
  EXPECT_NEAR(m.score(Verdict::ok, 1.5, "new_task"), 0.5, 1e-12);
  // score(Result) takes the task from the result.
  Result r;
  r.verdict = Verdict::ok;
  r.speedup = 10.5;
  r.task = "fast_task";
  EXPECT_GT(m.score(r), 0.0);
  r.task = "slow_task";
  r.speedup = 0.95;
  EXPECT_LT(m.score(r), 0.0);
  // The neutral reward of a degenerate result is 1.0x scored against its own task.
  EXPECT_LT(m.neutral_reward("fast_task"), -1.9);
  EXPECT_DOUBLE_EQ(m.neutral_reward("no_such_task"), 0.0);
}

// ok_bonus: a correctness term added to every ok reward (any kind), never to a failure.
TEST(RewardTest, OkBonusRaisesEveryCorrectKernelAndNoFailure) {
  for (const char* kind : {"speedup", "log_speedup", "cuda_l1"}) {
    RewardOptions o;
    o.kind = kind;
    o.ok_bonus = 1.0;
    o.incorrect = -1.0;
    RewardModel with(o);
    o.ok_bonus = 0.0;
    RewardModel without(o);
    EXPECT_DOUBLE_EQ(with.score(Verdict::ok, 0.3, "t"), without.score(Verdict::ok, 0.3, "t") + 1.0) << kind;
    EXPECT_DOUBLE_EQ(with.score(Verdict::incorrect, 0.0, "t"), -1.0) << kind;
    EXPECT_DOUBLE_EQ(with.neutral_reward("t"), without.neutral_reward("t") + 1.0) << kind;
  }
}

TEST(RewardTest, WindowForgetsOldSamples) {
  RewardOptions o;
  o.window = 3;
  o.min_samples = 1;
  RewardModel m(o);
  for (double s : {10.0, 10.0, 10.0, 1.0, 1.0, 1.0}) m.score(Verdict::ok, s);
  EXPECT_NEAR(m.running_mean(), 1.0, 1e-12);
  EXPECT_EQ(m.samples(), 3);
}

TEST(RewardTest, OtherKindsAndBadConfig) {
  RewardOptions o;
  o.kind = "log_speedup";
  EXPECT_NEAR(RewardModel(o).score(Verdict::ok, std::exp(1.0)), 1.0, 1e-12);
  o.kind = "speedup";
  EXPECT_NEAR(RewardModel(o).score(Verdict::ok, 2.0), 1.0, 1e-12);
  o.kind = "bogus";
  EXPECT_THROW(RewardModel{o}, kf::Error);
}

// A degenerate task's ok result is scored as speedup 1.0 whatever it measured, in every
// kind, and does not move cuda_l1's running statistics.
TEST(RewardTest, DegenerateTaskGivesNoSpeedReward) {
  Result r;
  r.verdict = Verdict::ok;
  r.speedup = 10.1;
  r.task_degenerate = true;
  r.degenerate_reason = "reference output is (nearly) the same for different inputs";
  for (const char* kind : {"speedup", "log_speedup", "cuda_l1"}) {
    RewardOptions o;
    o.kind = kind;
    RewardModel m(o);
    EXPECT_DOUBLE_EQ(m.score(r), 0.0) << kind;
    EXPECT_DOUBLE_EQ(m.score(r), m.score(Verdict::ok, 1.0)) << kind;
    Result honest = r;
    honest.task_degenerate = false;
    EXPECT_GT(RewardModel(o).score(honest), 1.0) << kind;  // the same speedup on a sound task pays
  }
  // cuda_l1 past its warm-up: the normalised score of 1.0, statistics untouched.
  RewardOptions o;
  o.min_samples = 4;
  RewardModel m(o);
  for (double s : {1.5, 2.0, 2.5, 2.0}) m.score(Verdict::ok, s);
  const double mean = m.running_mean(), sd = m.running_std();
  const double got = m.score(r);
  EXPECT_NEAR(got, std::max(-2.0, (1.0 - mean) / sd), 1e-9);
  EXPECT_LT(got, 0);
  EXPECT_EQ(m.samples(), 4);
  EXPECT_DOUBLE_EQ(m.running_mean(), mean);
  EXPECT_DOUBLE_EQ(m.neutral_reward(), got);
  // Failures on a degenerate task keep their failure reward.
  r.verdict = Verdict::incorrect;
  EXPECT_DOUBLE_EQ(m.score(r), m.failure_reward(Verdict::incorrect));
}

TEST(ResultTest, ReportsTheSpeedupIntervalAndTheUnstableFlag) {
  Result r;
  r.task = "t";
  r.verdict = Verdict::ok;
  r.speedup = 1.234;
  r.speedup_lo = 1.18;
  r.speedup_hi = 1.29;
  std::string t = to_text(r);
  EXPECT_NE(t.find("speedup    1.234x (95 % 1.180\xe2\x80\x93"
                   "1.290)\n"),
            std::string::npos)
      << t;
  EXPECT_EQ(t.find("timing unstable"), std::string::npos) << t;
  auto j = nlohmann::json::parse(to_json(r));
  EXPECT_DOUBLE_EQ(j["speedup_lo"].get<double>(), 1.18);
  EXPECT_DOUBLE_EQ(j["speedup_hi"].get<double>(), 1.29);
  EXPECT_DOUBLE_EQ(j["speedup_confidence"].get<double>(), 0.95);
  EXPECT_FALSE(j["timing_unstable"].get<bool>());
  EXPECT_TRUE(j["speed_rewarded"].get<bool>());

  r.timing_unstable = true;
  r.speedup = r.speedup_lo;
  t = to_text(r);
  EXPECT_NE(t.find("speedup    1.180x (95 % 1.180"), std::string::npos) << t;
  EXPECT_NE(t.find("timing unstable: conservative estimate"), std::string::npos) << t;
  j = nlohmann::json::parse(to_json(r));
  EXPECT_TRUE(j["timing_unstable"].get<bool>());
  EXPECT_DOUBLE_EQ(j["speedup"].get<double>(), 1.18);

  // No interval measured (older results): the speedup alone.
  r.speedup_lo = r.speedup_hi = 0;
  r.timing_unstable = false;
  EXPECT_NE(to_text(r).find("speedup    1.180x\n"), std::string::npos) << to_text(r);
  // Not ok: no speedup line at all.
  r.verdict = Verdict::incorrect;
  EXPECT_EQ(to_text(r).find("speedup "), std::string::npos) << to_text(r);
}

TEST(ResultTest, DegenerateTaskSaysNoSpeedReward) {
  Result r;
  r.task = "041_mse_loss";
  r.verdict = Verdict::ok;
  r.speedup = 10.1;
  r.task_degenerate = true;
  r.degenerate_reason = "reference output is (nearly) the same for different inputs";
  const std::string t = to_text(r);
  EXPECT_NE(t.find("DEGENERATE: reference output is (nearly) the same for different inputs; no speed reward"),
            std::string::npos)
      << t;
  const auto j = nlohmann::json::parse(to_json(r));
  EXPECT_TRUE(j["task_degenerate"].get<bool>());
  EXPECT_FALSE(j["speed_rewarded"].get<bool>());
  r.task_degenerate = false;
  EXPECT_EQ(to_text(r).find("no speed reward"), std::string::npos);
  EXPECT_TRUE(nlohmann::json::parse(to_json(r))["speed_rewarded"].get<bool>());
}

TEST(ResultTest, JsonAndTextNameTheVerdict) {
  Result r;
  r.task = "t";
  r.verdict = Verdict::rejected_cheat;
  r.reason = "results cached across calls";
  r.checks.push_back({"correct.distribution", true, ""});
  const std::string j = to_json(r);
  EXPECT_NE(j.find("\"verdict\":\"rejected_cheat\""), std::string::npos);
  EXPECT_NE(to_text(r).find("results cached across calls"), std::string::npos);
}
