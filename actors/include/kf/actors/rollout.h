// One rollout: G completions of a prompt sampled as a group, each decoded to text without
// its stopping end-of-sequence token and its kernel extracted. Actors, tools/optimize and
// tools/selfsup all sample through it, so a sample means the same thing everywhere: the same
// sampling knobs (SamplingParams, top-k included), the same text and the same extraction.
// What happens next differs by caller: an actor queues the candidates for the evaluators,
// optimize and selfsup verify them in process.
// Threading: one thread; the model must not be used concurrently.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "kf/actors/codec.h"
#include "kf/actors/extract.h"
#include "kf/policy/policy.h"

namespace kf::actors {

struct RolloutSample {
  policy::Completion completion;  // tokens (the stopping token included), behaviour log-probs
  std::string text;               // the completion as text, without a final end-of-sequence token
  Extraction kernel;              // the extracted kernel, or why there is none
};

std::vector<RolloutSample> rollout_group(policy::CausalLM& model, const TextCodec& codec,
                                         const std::vector<int32_t>& prompt, int64_t G,
                                         const policy::SamplingParams& sampling, int64_t valid_vocab,
                                         const ExtractOptions& extract, bool shared_prefill = true);

// The completions of one group as samples: text and extracted kernel (rollout_group's
// second half; the actor's engine path, which samples many groups at once, uses it too).
std::vector<RolloutSample> rollout_samples(const TextCodec& codec, std::vector<policy::Completion> completions,
                                           const ExtractOptions& extract);

// The text of a completion: its tokens decoded, less the end-of-sequence token that stopped
// it (not text: a byte model's would decode to a NUL).
std::string completion_text(const TextCodec& codec, const policy::Completion& c);

}  // namespace kf::actors
