// Record encoding: round trips, and clear errors for truncated or foreign bytes.
#include <gtest/gtest.h>

#include "kf/common/error.h"
#include "kf/replay/replay.h"
#include "queue.h"

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

// The candidate queue's record: a fixed-size handle. A whole candidate record (what an
// older build queued) is refused with an error that says so.
TEST(ReplayRecordsTest, CandidateHandleRoundTripsAndAnOldWholeCandidateIsNamed) {
  Candidate c;
  c.id = 11;
  c.group_id = 22;
  c.index_in_group = 5;
  c.t_pushed_ns = 33;
  c.source = "int main(){}";
  const CandidateRef r = ref_of(c);
  std::vector<unsigned char> buf(encoded_size(r));
  encode(r, buf.data());
  const CandidateRef d = decode_candidate_ref(buf.data(), buf.size());
  EXPECT_EQ(d.candidate_id, 11u);
  EXPECT_EQ(d.group_id, 22u);
  EXPECT_EQ(d.index_in_group, 5u);
  EXPECT_EQ(d.t_pushed_ns, 33);
  EXPECT_THROW(decode_candidate_ref(buf.data(), buf.size() - 1, "q"), kf::Error);
  std::vector<unsigned char> whole(encoded_size(c));
  encode(c, whole.data());
  try {
    decode_candidate_ref(whole.data(), whole.size(), "kf.run.cand");
    FAIL() << "a whole candidate was read as a handle";
  } catch (const kf::Error& e) {
    EXPECT_NE(std::string(e.what()).find("older build"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("kf.run.cand"), std::string::npos) << e.what();
  }
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
  // A version-1 record (saved replay files of older runs) still decodes, without the new
  // fields: no cause byte (offset 29, after the verdict), no interval and flags (the last 17).
  std::vector<unsigned char> v1(b.begin(), b.end() - 17);
  v1.erase(v1.begin() + 29);
  v1[4] = 1;
  s = decode_result(v1.data(), v1.size());
  EXPECT_EQ(s.candidate_id, 9u);
  EXPECT_DOUBLE_EQ(s.speedup_hi, 0.0);
  EXPECT_FALSE(s.task_degenerate);
}

// Offset of the cause byte in a version-3 result: tag, version, candidate_id, group_id,
// index_in_group, verdict.
constexpr std::size_t kCauseAt = 4 + 4 + 8 + 8 + 4 + 1;

TEST(ReplayRecordsTest, ResultCarriesItsCause) {
  Result r;
  r.candidate_id = 5;
  r.verdict = Verdict::runtime_error;
  r.reason = "out of GPU memory on 3 tries: cudaMalloc failed";
  EXPECT_EQ(r.cause, Cause::kernel) << "a result is the kernel's doing unless the evaluator says otherwise";
  for (Cause c : {Cause::environment, Cause::kernel}) {
    r.cause = c;
    std::vector<unsigned char> b(encoded_size(r));
    encode(r, b.data());
    ASSERT_EQ(b[kCauseAt], static_cast<unsigned char>(c));
    const Result s = decode_result(b.data(), b.size());
    EXPECT_EQ(s.cause, c) << cause_name(c);
    EXPECT_EQ(s.verdict, Verdict::runtime_error);
    EXPECT_EQ(s.reason, r.reason) << "the reason is kept as written, with no prefix";
  }
  EXPECT_STREQ(cause_name(Cause::environment), "environment");
  EXPECT_STREQ(cause_name(Cause::kernel), "kernel");
}

TEST(ReplayRecordsTest, UnknownCauseIsRejectedWithTheField) {
  Result r;
  r.cause = Cause::environment;
  std::vector<unsigned char> b(encoded_size(r));
  encode(r, b.data());
  b[kCauseAt] = 7;
  try {
    (void)decode_result(b.data(), b.size(), "kf.run.res");
    FAIL() << "unknown cause accepted";
  } catch (const kf::Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("kf.run.res: result record: field cause"), std::string::npos) << m;
    EXPECT_NE(m.find("7 unknown"), std::string::npos) << m;
  }
}

TEST(ReplayRecordsTest, VersionTwoResultDecodesAsTheKernelsCause) {
  Result r;
  r.candidate_id = 11;
  r.verdict = Verdict::timeout;
  r.reason = "timed out";
  r.speedup_hi = 2.5;
  r.cause = Cause::environment;
  std::vector<unsigned char> b(encoded_size(r));
  encode(r, b.data());
  std::vector<unsigned char> v2(b);
  v2.erase(v2.begin() + kCauseAt);
  v2[4] = 2;
  const Result s = decode_result(v2.data(), v2.size());
  EXPECT_EQ(s.candidate_id, 11u);
  EXPECT_EQ(s.verdict, Verdict::timeout);
  EXPECT_EQ(s.reason, "timed out");
  EXPECT_DOUBLE_EQ(s.speedup_hi, 2.5);
  EXPECT_EQ(s.cause, Cause::kernel);
  // A version this build does not know is an error naming the field.
  b[4] = 4;
  try {
    (void)decode_result(b.data(), b.size());
    FAIL() << "version 4 accepted";
  } catch (const kf::Error& e) {
    EXPECT_NE(std::string(e.what()).find("field version"), std::string::npos) << e.what();
  }
}

// Record version 3 carries the probe flag (actors.probe); records of versions 1 and 2 (before
// it) still decode, as samples to train on.
TEST(ReplayRecordsTest, ProbeFlagRoundTripsAndOlderCandidatesDecodeAsNoProbe) {
  Candidate c;
  c.id = 5;
  c.task = "001_relu";
  c.prompt_tokens = {1, 2, 3};
  c.completion_tokens = {4, 5};
  c.behaviour_logprobs = {-0.5f, -0.25f};
  c.source = "int x;";
  c.turn = 1;
  c.turns = 1;
  c.probe = true;
  std::vector<unsigned char> buf(encoded_size(c));
  encode(c, buf.data());
  EXPECT_EQ(buf[4], 3) << "record version";
  const Candidate d = decode_candidate(buf.data(), buf.size());
  EXPECT_TRUE(d.probe);
  EXPECT_EQ(d.completion_tokens, c.completion_tokens);
  c.probe = false;
  encode(c, buf.data());
  EXPECT_FALSE(decode_candidate(buf.data(), buf.size()).probe);

  // Version 2: the same bytes without the probe byte.
  c.probe = true;
  encode(c, buf.data());
  std::vector<unsigned char> v2(buf.begin(), buf.end() - 1);
  v2[4] = 2;
  const Candidate d2 = decode_candidate(v2.data(), v2.size());
  EXPECT_FALSE(d2.probe);
  EXPECT_EQ(d2.task, "001_relu");
  EXPECT_EQ(d2.source, "int x;");
  // Version 1: without turn (4), turns (4), parent_group_id (8), parent_index (4) either.
  std::vector<unsigned char> v1(buf.begin(), buf.end() - 21);
  v1[4] = 1;
  const Candidate d1 = decode_candidate(v1.data(), v1.size());
  EXPECT_FALSE(d1.probe);
  EXPECT_EQ(d1.turn, 1u);
  EXPECT_EQ(d1.behaviour_logprobs, c.behaviour_logprobs);
  // A probe byte other than 0 or 1 is named.
  buf.back() = 2;
  try {
    decode_candidate(buf.data(), buf.size(), "q");
    FAIL() << "probe byte 2 accepted";
  } catch (const kf::Error& e) {
    EXPECT_NE(std::string(e.what()).find("probe"), std::string::npos) << e.what();
  }
}
