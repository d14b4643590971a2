// From scored groups to training tensors: filter the groups (staleness, no signal,
// missing results), compute group-relative advantages and pairs, and cut the sequences
// into micro-batches of at most `micro_batch_tokens` tokens, either
// - packed (learner.pack): one row of whole sequences back to back, no padding; the model
//   restarts positions and confines attention per sequence (CausalLMImpl::hidden_packed);
// - padded: rows right-padded to the micro-batch's longest sequence.
//
// Why a pairwise objective keeps groups whole in a micro-batch: its loss is non-linear in
// a pair's two log-prob sums, so both must be in one forward; GRPO does not care, and
// packs sequence by sequence. A unit (group or sequence) larger than the budget becomes a
// micro-batch of its own.
// Plain functions; any thread.
#pragma once
#include <torch/torch.h>

#include <cstdint>
#include <utility>
#include <vector>

#include "kf/learner/learner.h"
#include "kf/replay/replay.h"

namespace kf::learner {

struct Sequence {
  std::vector<int32_t> tokens;  // prompt + completion
  int64_t prompt_len = 0;
  std::vector<float> behaviour;  // one per completion token
  double reward = 0;
  double advantage = 0;
  int64_t group = 0;  // index of its group in this step's batch
};

struct BatchCounts {
  int64_t groups_in = 0, groups_used = 0, dropped_stale = 0, skipped_equal = 0, skipped_small = 0;
  int64_t candidates_missing = 0, candidates_malformed = 0;
  int64_t candidates_environment = 0;  // verdicts the machine caused (Result::cause == Cause::environment)
  int64_t probe_groups = 0;            // probe groups (actors.probe): measured, never trained on
};

struct StepBatch {
  std::vector<Sequence> seqs;
  std::vector<std::pair<int64_t, int64_t>> pairs;  // indices into seqs: (faster, slower)
  std::vector<std::vector<int64_t>> groups;        // sequence indices of each used group
  BatchCounts counts;
  int64_t completion_tokens() const;
};

// Filters and scores `groups` for a learner at `current_version`. A probe group
// (replay::is_probe: the actors' learning-curve probe) is never trained on: it is counted
// in groups_in and probe_groups and left out. A group is dropped
// when current_version - policy_version > max_staleness (counted), skipped when its
// rewards are all equal (GRPO and pairwise: no signal) or fewer than two candidates
// have results and usable tokens. Candidates with a missing result, no completion
// tokens or a behaviour log-prob count that differs from the token count are left out
// (counted) and the group's advantages are computed over the rest.
// vocab_size > 0: a token id outside [0, vocab_size) makes its candidate malformed (a
// tokenizer/model mismatch between actor and learner must not crash the embedding).
// Multi-turn groups (a candidate's turns > 1, actors.turns): each turn is its own group, a
// member's prompt is its own conversation (Candidate::prompt_tokens when set) and the
// advantages are turn_advantages (docs/learner.md, "Multi-turn refinement").
// The placebo of learner.grpo.shuffle_rewards: a permutation of one group's rewards drawn
// from (seed, version, group id), so every rank and a rerun draw the same one.
void shuffle_within_group(std::vector<double>& rewards, uint64_t seed, int64_t version, uint64_t group_id);

StepBatch build_step_batch(const std::vector<replay::ScoredGroup>& groups, int64_t current_version,
                           const LearnerConfig& cfg, int64_t vocab_size = 0);

// Per-turn leave-one-out (Dr. Kernel's TRLOO): A_i = r_i - mean of the other members'
// rewards of the same turn, divided by the population std of the turn's rewards + eps
// when std_normalize. Fewer than two rewards: all zero.
std::vector<double> turn_advantages(const std::vector<double>& rewards, bool std_normalize, double eps);

// Position t of the [B, T-1] tensors is token_logprobs' position t: it predicts token t+1.
struct MicroBatch {
  torch::Tensor ids;               // int64 [B, T]: right-padded rows, or one packed row (B = 1)
  torch::Tensor attention;         // int64 [B, T], 1 = token
  torch::Tensor behaviour;         // fp32 [B, T-1], aligned with token_logprobs
  torch::Tensor completion;        // fp32 [B, T-1], 1 on completion tokens
  torch::Tensor advantages;        // fp32 [B, T-1]: the sequence's advantage on its completion tokens, else 0
  torch::Tensor inv_len;           // fp32 [B, T-1]: 1 / (the sequence's completion tokens) on them, else 0
  torch::Tensor seq_slot;          // int64 [B, T-1]: index into seq_index of the sequence a completion
                                   // position belongs to, 0 elsewhere (per-sequence sums by index_add)
  std::vector<int64_t> seq_index;  // which StepBatch sequences, in row (or packing) order
  std::vector<int64_t> segments;   // packed: the sequences' lengths along the row; padded: empty
  int64_t real_tokens = 0;         // tokens of the sequences, without padding
  int64_t padded_tokens() const { return ids.numel(); }
  bool packed() const { return !segments.empty(); }
};

// Padded: greedy, groups in order, each micro-batch at most max_tokens padded tokens
// (B * longest) unless one group alone exceeds it. Returns sequence indices per batch.
std::vector<std::vector<int64_t>> pack_micro_batches(const StepBatch& b, int64_t max_tokens);
MicroBatch make_micro_batch(const StepBatch& b, const std::vector<int64_t>& seq_index);

// Packed: first-fit decreasing of units (whole groups when whole_groups, else single
// sequences) into rows of at most max_tokens tokens; a unit longer than max_tokens gets a
// row of its own. Deterministic (ties keep batch order). Returns sequence indices per row.
std::vector<std::vector<int64_t>> pack_sequences(const StepBatch& b, int64_t max_tokens, bool whole_groups);
// One row [1, sum of lengths] of the sequences in order; segments holds their lengths.
MicroBatch make_packed_micro_batch(const StepBatch& b, const std::vector<int64_t>& seq_index);

}  // namespace kf::learner
