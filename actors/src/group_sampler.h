// Group sampling: G completions of one prompt that share the prefill.
//
// The prompt is prefilled once (batch 1); its KV cache is then replicated G times and
// the G rows decode together, each drawing its own tokens (one seeded generator for the
// group). policy::Sampler does the work (SamplingParams::shared_prefill), so the group
// decodes on the same path as any other generation: fixed-shape steps replayed as a CUDA
// graph on a GPU, the growing cache on the CPU. Each completion carries the per-token log-probs of the behaviour policy
// under softmax(logits / temperature), as the learner's importance ratios expect. Stops per row at an EOS id, a loop
// (SamplingParams::loop_repeats) or max_new_tokens (the stopping token included). shared_prefill = false falls back to
// policy::Sampler on G copies of the prompt (G prefills in one batch): same distribution, for comparison and as an
// escape hatch. Threading: one thread; the model must not be used concurrently.
#pragma once
#include <cstdint>
#include <vector>

#include "kf/policy/policy.h"

namespace kf::actors {

std::vector<policy::Completion> sample_group(policy::CausalLM& model, const std::vector<int32_t>& prompt, int64_t G,
                                             const policy::SamplingParams& p, int64_t valid_vocab,
                                             bool shared_prefill = true);

}  // namespace kf::actors
