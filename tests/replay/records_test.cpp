// Record encoding: round trips, and clear errors for truncated or foreign bytes.
#include <gtest/gtest.h>

#include "kf/common/error.h"
#include "kf/replay/records.h"

using namespace kf::replay;

TEST(ReplayRecordsTest, CandidateAndResultRoundTrip) {
  Candidate c;
  c.id = 1;
  c.task = "t";
  c.prompt_tokens = {7, 8};
  c.completion_tokens = {9};
  c.behaviour_logprobs = {-0.1f};
  c.extraction_error = "no code block";
  c.t_sampled_ns = 123;
  std::vector<unsigned char> buf(encoded_size(c));
  encode(c, buf.data());
  Candidate d = decode_candidate(buf.data(), buf.size());
  EXPECT_EQ(d.prompt_tokens, c.prompt_tokens);
  EXPECT_EQ(d.extraction_error, c.extraction_error);
  EXPECT_EQ(d.t_sampled_ns, 123);

  Result r;
  r.candidate_id = 1;
  r.verdict = Verdict::rejected_cheat;
  r.reason = "output does not depend on inputs";
  r.speedup = 1.5;
  r.reward = -1;
  std::vector<unsigned char> rb(encoded_size(r));
  encode(r, rb.data());
  Result s = decode_result(rb.data(), rb.size());
  EXPECT_EQ(s.verdict, Verdict::rejected_cheat);
  EXPECT_EQ(s.reason, r.reason);
  EXPECT_DOUBLE_EQ(s.speedup, 1.5);
  EXPECT_STREQ(verdict_name(s.verdict), "rejected_cheat");
}

TEST(ReplayRecordsTest, TruncatedOrForeignBytesAreRejectedWithTheField) {
  Candidate c;
  c.task = "task";
  c.source = "int main(){}";
  std::vector<unsigned char> buf(encoded_size(c));
  encode(c, buf.data());
  try {
    decode_candidate(buf.data(), buf.size() - 3, "q");
    FAIL() << "truncated record accepted";
  } catch (const kf::Error& e) {
    EXPECT_NE(std::string(e.what()).find("field"), std::string::npos) << e.what();
  }
  EXPECT_THROW(decode_result(buf.data(), buf.size()), kf::Error);  // a candidate is not a result
}

TEST(ReplayRecordsTest, ResultCarriesSpeedupIntervalAndFlags) {
  Result r;
  r.candidate_id = 9;
  r.verdict = Verdict::ok;
  r.speedup = 1.1;
  r.speedup_lo = 1.1;
  r.speedup_hi = 1.9;
  r.timing_unstable = true;
  r.task_degenerate = true;
  r.exclude_from_training = true;
  std::vector<unsigned char> b(encoded_size(r));
  encode(r, b.data());
  Result s = decode_result(b.data(), b.size());
  EXPECT_DOUBLE_EQ(s.speedup_lo, 1.1);
  EXPECT_DOUBLE_EQ(s.speedup_hi, 1.9);
  EXPECT_TRUE(s.timing_unstable);
  EXPECT_TRUE(s.task_degenerate);
  EXPECT_TRUE(s.exclude_from_training);
  r.timing_unstable = r.exclude_from_training = false;
  encode(r, b.data());
  s = decode_result(b.data(), b.size());
  EXPECT_FALSE(s.timing_unstable);
  EXPECT_TRUE(s.task_degenerate);
  EXPECT_FALSE(s.exclude_from_training);
  // An unknown flag bit (the last byte) is an error naming the field.
  b.back() = 0x80;
  try {
    (void)decode_result(b.data(), b.size());
    FAIL() << "unknown flag accepted";
  } catch (const kf::Error& e) {
    EXPECT_NE(std::string(e.what()).find("flags"), std::string::npos) << e.what();
  }
  // A version-1 record (saved replay files of older runs) still decodes, without the new fields.
  std::vector<unsigned char> v1(b.begin(), b.end() - 17);
  v1[4] = 1;
  s = decode_result(v1.data(), v1.size());
  EXPECT_EQ(s.candidate_id, 9u);
  EXPECT_DOUBLE_EQ(s.speedup_hi, 0.0);
  EXPECT_FALSE(s.task_degenerate);
}
