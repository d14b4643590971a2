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
