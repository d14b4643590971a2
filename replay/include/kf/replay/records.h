// The records that travel between actors, evaluators and the learner (ARCHITECTURE.md
// "Records"), and their compact binary encoding. replay/ owns this layout.
//
// Encoding: little-endian, a 4-byte tag and a format version, then the fields in the
// order declared; strings and arrays as u32 length + bytes. Decoding checks every
// length against the buffer and throws kf::Error naming the record and field, so a
// bad or truncated buffer is never half-read. Plain functions: any thread.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace kf::replay {

struct Candidate {
  uint64_t id = 0;
  std::string task;
  uint64_t group_id = 0;
  uint32_t index_in_group = 0;  // 0..G-1
  int64_t policy_version = 0;   // behaviour policy that sampled it
  std::vector<int32_t> prompt_tokens;
  std::vector<int32_t> completion_tokens;
  std::vector<float> behaviour_logprobs;  // one per completion token
  std::string source;                     // extracted kernel source (empty on error)
  std::string extraction_error;           // why no source could be extracted
  int32_t actor_id = 0;
  int64_t t_sampled_ns = 0;  // CLOCK_MONOTONIC
  int64_t t_pushed_ns = 0;
  // Multi-turn refinement (actors.turns, docs/actors.md): turn 1 is the first answer; turn
  // t > 1 revises the member's turn t-1 answer after the verifier's feedback, and its
  // prompt_tokens hold the whole conversation so far (its own, not the group's). turns:
  // the most turns the actor allows (1: single turn); parent_group_id: the turn-1 group
  // (0 at turn 1); parent_index: the member's index_in_group there.
  uint32_t turn = 1;
  uint32_t turns = 1;
  uint64_t parent_group_id = 0;
  uint32_t parent_index = 0;
};

// What the candidate queue carries: a fixed-size handle of a candidate that lives in its
// replay group (the group is the one home of the candidate's tokens, log-probs and
// source). Consumers resolve it with ReplayBuffer::read_candidate after claiming it.
struct CandidateRef {
  uint64_t candidate_id = 0;
  uint64_t group_id = 0;
  uint32_t index_in_group = 0;
  int64_t t_pushed_ns = 0;  // CLOCK_MONOTONIC; copied into the resolved candidate
};
CandidateRef ref_of(const Candidate& c);  // id, group id and index of c; t_pushed_ns = c.t_pushed_ns
// Encoded size of every CandidateRef: tag, version, the four fields. A candidate queue
// slot holds exactly this many bytes.
constexpr std::size_t kCandidateRefBytes = 4 + 4 + 8 + 8 + 4 + 8;

// The one verdict type of the system: the evaluator produces it, the records carry it,
// the learner and the live status read it. Names as in ARCHITECTURE.md "Records".
enum class Verdict : uint8_t { compile_error, runtime_error, timeout, incorrect, rejected_cheat, ok };
const char* verdict_name(Verdict v);  // "compile_error", ..., "ok"

// Who caused a verdict. `kernel`: the candidate's own doing (every ok, and most failures).
// `environment`: the machine, not the kernel (still out of GPU memory after the
// evaluator's retries, the sandbox worker killed from outside, the compiler could not
// run, an unknown task, an evaluator-side error). The learner leaves environment verdicts
// out of the update, as if unscored: scored -3 like a crash, such results taught the
// policy noise (in H200 runs of 2026-12-03, 60 % of the rewards were out-of-memory
// verdicts of correct and incorrect kernels alike).
enum class Cause : uint8_t { kernel, environment };
const char* cause_name(Cause c);  // "kernel", "environment"

struct Result {
  uint64_t candidate_id = 0;
  uint64_t group_id = 0;        // routing: copied from the candidate
  uint32_t index_in_group = 0;  // routing: copied from the candidate
  Verdict verdict = Verdict::compile_error;
  Cause cause = Cause::kernel;
  std::string reason;  // human text; says what happened, never parsed
  double ref_time_median_us = 0, ref_time_spread_us = 0;
  double cand_time_median_us = 0, cand_time_spread_us = 0;
  double speedup = 0;
  double max_error = 0;
  uint32_t checks_passed = 0;
  double reward = 0;
  int32_t evaluator_id = 0;
  int64_t t_scored_ns = 0;
  // Interval of the speedup from paired timing trials (0 when not timed). When
  // timing_unstable, `speedup` is the conservative estimate speedup_lo.
  double speedup_lo = 0, speedup_hi = 0;
  bool timing_unstable = false;
  bool task_degenerate = false;  // the task's reference output is (nearly) input-independent
  // The learner leaves this result out of training (its group is dropped): set by the
  // evaluator for degenerate tasks unless evaluator.train_on_degenerate_tasks.
  bool exclude_from_training = false;
};

std::size_t encoded_size(const Candidate& c);
std::size_t encoded_size(const Result& r);
inline std::size_t encoded_size(const CandidateRef&) { return kCandidateRefBytes; }
// Write exactly encoded_size(x) bytes at dst.
void encode(const Candidate& c, unsigned char* dst);
void encode(const Result& r, unsigned char* dst);
void encode(const CandidateRef& r, unsigned char* dst);
// Throw kf::Error("<context>: candidate record: field <f>: ...") on malformed input.
Candidate decode_candidate(const unsigned char* src, std::size_t n, const std::string& context = "replay");
CandidateRef decode_candidate_ref(const unsigned char* src, std::size_t n, const std::string& context = "replay");
Result decode_result(const unsigned char* src, std::size_t n, const std::string& context = "replay");

}  // namespace kf::replay
