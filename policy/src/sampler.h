// Token sampling and the loop stop, shared by the Sampler and the Engine (kf/policy/policy.h)
// and tested on their own (tests/policy/sampler_test.cpp). Runs on the logits' device.
#pragma once
#include <torch/torch.h>

#include <cstdint>
#include <utility>
#include <vector>

#include "kf/policy/policy.h"

namespace kf::policy {

// The smallest period P in [1, p.loop_max_period] such that `tokens` ends with k >=
// p.loop_repeats repeats of one block of P tokens, k * P >= p.loop_min_span; 0 if none
// (always 0 when p.loop_repeats < 2). Cheap on text that does not loop: each P gives up
// at its first mismatch from the end. A row that loops is cut right after the token that
// completed the loop (finish_reason "loop", also when that token is the last allowed).
int64_t loop_period(const std::vector<int32_t>& tokens, const SamplingParams& p);

// Samples one token per row from logits [B, V] (fp32). Returns (tokens int64 [B],
// log-probs fp32 [B], of the distribution sampled from: sampling_logits). No host sync.
std::pair<torch::Tensor, torch::Tensor> sample_tokens(const torch::Tensor& logits, const SamplingParams& p,
                                                      int64_t valid_vocab, at::Generator& gen);

}  // namespace kf::policy
