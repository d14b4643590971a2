// The records and their encoding: Candidate, Result, CandidateRef (records of replay.h, the
// handle's encoding of queue.h). Format versions and the fields each adds: below.
#include "queue.h"

#include "codec.h"

namespace kf::replay {
using detail::ByteReader;
using detail::ByteWriter;

namespace {
constexpr uint32_t kCandidateTag = 0x444E4143;  // "CAND"
constexpr uint32_t kResultTag = 0x53455252;     // "RRES"
constexpr uint32_t kRefTag = 0x46455243;        // "CREF"
constexpr uint32_t kRefVersion = 1;
// Candidates: 2 added turn, turns, parent_group_id and parent_index at the end, 3 the probe
// byte after them; 1 still decodes, as a single-turn candidate, and 1 and 2 as no probe.
constexpr uint32_t kRecordVersion = 3;
// Results: 2 added speedup_lo/hi and the flags, 3 the cause byte after the verdict.
// 1 and 2 still decode, with cause kernel.
constexpr uint32_t kResultVersion = 3;
constexpr uint8_t kTimingUnstable = 1, kTaskDegenerate = 2, kExcludeFromTraining = 4;
}  // namespace

const char* verdict_name(Verdict v) {
  switch (v) {
    case Verdict::compile_error:
      return "compile_error";
    case Verdict::runtime_error:
      return "runtime_error";
    case Verdict::timeout:
      return "timeout";
    case Verdict::incorrect:
      return "incorrect";
    case Verdict::rejected_cheat:
      return "rejected_cheat";
    case Verdict::ok:
      return "ok";
  }
  return "unknown";
}

const char* cause_name(Cause c) {
  switch (c) {
    case Cause::kernel:
      return "kernel";
    case Cause::environment:
      return "environment";
  }
  return "unknown";
}

std::size_t encoded_size(const Candidate& c) {
  return 8 + 8 + (4 + c.task.size()) + 8 + 4 + 8 + (4 + c.prompt_tokens.size() * 4) +
         (4 + c.completion_tokens.size() * 4) + (4 + c.behaviour_logprobs.size() * 4) + (4 + c.source.size()) +
         (4 + c.extraction_error.size()) + 4 + 8 + 8 + 4 + 4 + 8 + 4 + 1;
}

void encode(const Candidate& c, unsigned char* dst) {
  ByteWriter w(dst);
  w.put(kCandidateTag);
  w.put(kRecordVersion);
  w.put(c.id);
  w.str(c.task);
  w.put(c.group_id);
  w.put(c.index_in_group);
  w.put(c.policy_version);
  w.vec(c.prompt_tokens);
  w.vec(c.completion_tokens);
  w.vec(c.behaviour_logprobs);
  w.str(c.source);
  w.str(c.extraction_error);
  w.put(c.actor_id);
  w.put(c.t_sampled_ns);
  w.put(c.t_pushed_ns);
  w.put(c.turn);
  w.put(c.turns);
  w.put(c.parent_group_id);
  w.put(c.parent_index);
  w.put(static_cast<uint8_t>(c.probe ? 1 : 0));
}

Candidate decode_candidate(const unsigned char* src, std::size_t n, const std::string& context) {
  ByteReader r(src, n, context + ": candidate record");
  if (r.get<uint32_t>("tag") != kCandidateTag) r.fail("tag", "not a candidate record");
  uint32_t v = r.get<uint32_t>("version");
  if (v < 1 || v > kRecordVersion)
    r.fail("version", std::to_string(v) + ", expected 1 to " + std::to_string(kRecordVersion));
  Candidate c;
  c.id = r.get<uint64_t>("id");
  c.task = r.str("task");
  c.group_id = r.get<uint64_t>("group_id");
  c.index_in_group = r.get<uint32_t>("index_in_group");
  c.policy_version = r.get<int64_t>("policy_version");
  c.prompt_tokens = r.vec<int32_t>("prompt_tokens");
  c.completion_tokens = r.vec<int32_t>("completion_tokens");
  c.behaviour_logprobs = r.vec<float>("behaviour_logprobs");
  c.source = r.str("source");
  c.extraction_error = r.str("extraction_error");
  c.actor_id = r.get<int32_t>("actor_id");
  c.t_sampled_ns = r.get<int64_t>("t_sampled_ns");
  c.t_pushed_ns = r.get<int64_t>("t_pushed_ns");
  if (v >= 2) {
    c.turn = r.get<uint32_t>("turn");
    c.turns = r.get<uint32_t>("turns");
    c.parent_group_id = r.get<uint64_t>("parent_group_id");
    c.parent_index = r.get<uint32_t>("parent_index");
    if (c.turn < 1 || c.turn > c.turns)
      r.fail("turn", std::to_string(c.turn) + " outside 1.." + std::to_string(c.turns) + " (turns)");
  }
  if (v >= 3) {
    const auto probe = r.get<uint8_t>("probe");
    if (probe > 1) r.fail("probe", std::to_string(probe) + ", expected 0 or 1");
    c.probe = probe == 1;
  }
  if (r.left() != 0) r.fail("end", std::to_string(r.left()) + " trailing bytes");
  return c;
}

CandidateRef ref_of(const Candidate& c) {
  CandidateRef r;
  r.candidate_id = c.id;
  r.group_id = c.group_id;
  r.index_in_group = c.index_in_group;
  r.t_pushed_ns = c.t_pushed_ns;
  return r;
}

void encode(const CandidateRef& x, unsigned char* dst) {
  ByteWriter w(dst);
  w.put(kRefTag);
  w.put(kRefVersion);
  w.put(x.candidate_id);
  w.put(x.group_id);
  w.put(x.index_in_group);
  w.put(x.t_pushed_ns);
}

CandidateRef decode_candidate_ref(const unsigned char* src, std::size_t n, const std::string& context) {
  ByteReader r(src, n, context + ": candidate handle");
  const uint32_t tag = r.get<uint32_t>("tag");
  if (tag == kCandidateTag)
    r.fail("tag", "a whole candidate record, written by an older build (the candidate queue now carries handles)");
  if (tag != kRefTag) r.fail("tag", "not a candidate handle");
  uint32_t v = r.get<uint32_t>("version");
  if (v != kRefVersion) r.fail("version", std::to_string(v) + ", expected " + std::to_string(kRefVersion));
  CandidateRef x;
  x.candidate_id = r.get<uint64_t>("candidate_id");
  x.group_id = r.get<uint64_t>("group_id");
  x.index_in_group = r.get<uint32_t>("index_in_group");
  x.t_pushed_ns = r.get<int64_t>("t_pushed_ns");
  if (r.left() != 0) r.fail("end", std::to_string(r.left()) + " trailing bytes");
  return x;
}

std::size_t encoded_size(const Result& x) {
  return 8 + 8 + 8 + 4 + 1 + 1 + (4 + x.reason.size()) + 8 * 6 + 4 + 8 + 4 + 8 + 8 + 8 + 1;
}

void encode(const Result& x, unsigned char* dst) {
  ByteWriter w(dst);
  w.put(kResultTag);
  w.put(kResultVersion);
  w.put(x.candidate_id);
  w.put(x.group_id);
  w.put(x.index_in_group);
  w.put(static_cast<uint8_t>(x.verdict));
  w.put(static_cast<uint8_t>(x.cause));
  w.str(x.reason);
  w.put(x.ref_time_median_us);
  w.put(x.ref_time_spread_us);
  w.put(x.cand_time_median_us);
  w.put(x.cand_time_spread_us);
  w.put(x.speedup);
  w.put(x.max_error);
  w.put(x.checks_passed);
  w.put(x.reward);
  w.put(x.evaluator_id);
  w.put(x.t_scored_ns);
  w.put(x.speedup_lo);
  w.put(x.speedup_hi);
  w.put(static_cast<uint8_t>((x.timing_unstable ? kTimingUnstable : 0) | (x.task_degenerate ? kTaskDegenerate : 0) |
                             (x.exclude_from_training ? kExcludeFromTraining : 0)));
}

Result decode_result(const unsigned char* src, std::size_t n, const std::string& context) {
  ByteReader r(src, n, context + ": result record");
  if (r.get<uint32_t>("tag") != kResultTag) r.fail("tag", "not a result record");
  uint32_t v = r.get<uint32_t>("version");
  if (v < 1 || v > kResultVersion)
    r.fail("version", std::to_string(v) + ", expected 1 to " + std::to_string(kResultVersion));
  Result x;
  x.candidate_id = r.get<uint64_t>("candidate_id");
  x.group_id = r.get<uint64_t>("group_id");
  x.index_in_group = r.get<uint32_t>("index_in_group");
  uint8_t verdict = r.get<uint8_t>("verdict");
  if (verdict > static_cast<uint8_t>(Verdict::ok)) r.fail("verdict", "value " + std::to_string(verdict) + " unknown");
  x.verdict = static_cast<Verdict>(verdict);
  if (v >= 3) {
    const uint8_t cause = r.get<uint8_t>("cause");
    if (cause > static_cast<uint8_t>(Cause::environment))
      r.fail("cause", "value " + std::to_string(cause) + " unknown");
    x.cause = static_cast<Cause>(cause);
  }
  x.reason = r.str("reason");
  x.ref_time_median_us = r.get<double>("ref_time_median_us");
  x.ref_time_spread_us = r.get<double>("ref_time_spread_us");
  x.cand_time_median_us = r.get<double>("cand_time_median_us");
  x.cand_time_spread_us = r.get<double>("cand_time_spread_us");
  x.speedup = r.get<double>("speedup");
  x.max_error = r.get<double>("max_error");
  x.checks_passed = r.get<uint32_t>("checks_passed");
  x.reward = r.get<double>("reward");
  x.evaluator_id = r.get<int32_t>("evaluator_id");
  x.t_scored_ns = r.get<int64_t>("t_scored_ns");
  if (v >= 2) {
    x.speedup_lo = r.get<double>("speedup_lo");
    x.speedup_hi = r.get<double>("speedup_hi");
    const uint8_t flags = r.get<uint8_t>("flags");
    if (flags & ~(kTimingUnstable | kTaskDegenerate | kExcludeFromTraining))
      r.fail("flags", "unknown bits " + std::to_string(flags));
    x.timing_unstable = flags & kTimingUnstable;
    x.task_degenerate = flags & kTaskDegenerate;
    x.exclude_from_training = flags & kExcludeFromTraining;
  }
  if (r.left() != 0) r.fail("end", std::to_string(r.left()) + " trailing bytes");
  return x;
}

}  // namespace kf::replay
