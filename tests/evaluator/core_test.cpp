// Torch-free parts: content hash, timing statistics, reward.
#include <gtest/gtest.h>

#include <cmath>

#include "../../evaluator/src/sha256.h"
#include "kf/common/error.h"
#include "kf/evaluator/result.h"
#include "kf/evaluator/reward.h"
#include "kf/evaluator/stats.h"

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
  for (Verdict v : {Verdict::CompileError, Verdict::RuntimeError, Verdict::Timeout, Verdict::Incorrect, Verdict::RejectedCheat})
    EXPECT_LT(m.score(v, 10.0), -2.0) << verdict_name(v);
  EXPECT_LT(m.score(Verdict::RejectedCheat, 0), m.score(Verdict::Incorrect, 0));
  // An ok result, however slow, scores above any failure.
  EXPECT_GE(m.score(Verdict::Ok, 0.01), -2.0);
}

TEST(RewardTest, CudaL1NormalisesWithRunningStatsAndClips) {
  RewardOptions o;
  o.min_samples = 4;
  o.clip = 2;
  RewardModel m(o);
  // Warm-up: clip(speedup - 1).
  EXPECT_NEAR(m.score(Verdict::Ok, 1.5), 0.5, 1e-12);
  m.score(Verdict::Ok, 1.0);
  m.score(Verdict::Ok, 2.0);
  m.score(Verdict::Ok, 1.5);
  EXPECT_EQ(m.samples(), 4);
  const double mean = 1.5, sd = std::sqrt(0.125);
  EXPECT_NEAR(m.running_mean(), mean, 1e-12);
  EXPECT_NEAR(m.score(Verdict::Ok, 1.6), (1.6 - mean) / sd, 1e-9);
  EXPECT_DOUBLE_EQ(m.score(Verdict::Ok, 0.001), -2.0);  // clipped
  EXPECT_DOUBLE_EQ(m.score(Verdict::Ok, 100.0), 2.0);   // clipped
}

TEST(RewardTest, WindowForgetsOldSamples) {
  RewardOptions o;
  o.window = 3;
  o.min_samples = 1;
  RewardModel m(o);
  for (double s : {10.0, 10.0, 10.0, 1.0, 1.0, 1.0}) m.score(Verdict::Ok, s);
  EXPECT_NEAR(m.running_mean(), 1.0, 1e-12);
  EXPECT_EQ(m.samples(), 3);
}

TEST(RewardTest, OtherKindsAndBadConfig) {
  RewardOptions o;
  o.kind = "log_speedup";
  EXPECT_NEAR(RewardModel(o).score(Verdict::Ok, std::exp(1.0)), 1.0, 1e-12);
  o.kind = "speedup";
  EXPECT_NEAR(RewardModel(o).score(Verdict::Ok, 2.0), 1.0, 1e-12);
  o.kind = "bogus";
  EXPECT_THROW(RewardModel{o}, kf::Error);
}

TEST(ResultTest, JsonAndTextNameTheVerdict) {
  Result r;
  r.task = "t";
  r.verdict = Verdict::RejectedCheat;
  r.reason = "results cached across calls";
  r.checks.push_back({"correct.distribution", true, ""});
  const std::string j = to_json(r);
  EXPECT_NE(j.find("\"verdict\":\"rejected_cheat\""), std::string::npos);
  EXPECT_NE(to_text(r).find("results cached across calls"), std::string::npos);
}
