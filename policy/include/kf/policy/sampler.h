// Sampler: batched generation with a preallocated KV cache. Prompts are left-padded into
// one prefill; each decode step samples one token per row (temperature, top-k, top-p,
// padding logits masked) and records its log-prob for the learner's importance ratios.
// Reproducible for a given seed on CPU. Per-row stop: EOS ids, stop strings, a loop (the
// completion ends with one block repeated; see loop_period), max tokens.
// Threading: one thread per Sampler; the model must not be used concurrently.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "kf/policy/gpu_share.h"
#include "kf/policy/model.h"
#include "kf/policy/tokenizer.h"

namespace kf::policy {

struct SamplingParams {
  double temperature = 1.0;  // 0 = greedy
  double top_p = 1.0;
  int64_t top_k = 0;  // 0 = off
  int64_t max_new_tokens = 256;
  // Loop stop: a row is done ("loop") once its completion ends with one block of p tokens
  // (p <= loop_max_period) repeated loop_repeats times or more in a row, the repeats
  // spanning at least loop_min_span tokens (so period 1 needs 64 equal tokens by default).
  // The row is cut right after the token that completed the loop (a prefix of what was
  // sampled; a loop that fills the last token is "loop", not "length").
  // loop_repeats: 0 = off, else >= 2.
  int64_t loop_repeats = 0;
  int64_t loop_max_period = 128;
  int64_t loop_min_span = 64;
  std::vector<int64_t> eos_ids;
  std::vector<std::string> stop;  // stop strings (need a tokenizer)
  uint64_t seed = 0;
  // Ids >= valid_vocab (checkpoint padding rows beyond the tokenizer) are never sampled;
  // -1 = the tokenizer's vocab size, or the model's when there is no tokenizer.
  int64_t valid_vocab = -1;
  // Host checks for EOS/stop strings/loops every N steps (each check is a device sync); the
  // result is exact for any N, a larger N only wastes some tokens after a stop.
  int64_t check_every = 8;
  // Decode with fixed shapes (KVCache::static_slot); on CUDA the step is then captured once
  // as a CUDA graph and replayed. Off: the eager, growing-cache path.
  // -1: on CUDA only (on CPU the growing cache is faster), 0: off, 1: on.
  int static_decode = -1;
  bool cuda_graph = true;
  // Every prompt is the same (a GRPO group): prefill one row and copy its KV cache to the
  // others, then decode them together (same decode path, CUDA graphs included).
  bool shared_prefill = false;
  // Shared GPU hold (gpu_share.h) for the whole generation, paused at every host check
  // (every check_every steps), so an evaluator's timed trial can run between chunks.
  GpuShare* gpu_share = nullptr;
};

struct Completion {
  std::vector<int32_t> tokens;  // the completion, the stopping token included
  std::vector<float> logprobs;  // log p(token) under softmax(logits / T), full vocab
  std::string text;             // decoded tokens (empty without a tokenizer)
  std::string finish_reason;    // "eos", "stop", "loop", "length"
};

// The smallest period P in [1, p.loop_max_period] such that `tokens` ends with k >=
// p.loop_repeats repeats of one block of P tokens, k * P >= p.loop_min_span; 0 if none
// (always 0 when p.loop_repeats < 2). Cheap on text that does not loop: each P gives up
// at its first mismatch from the end. The Sampler's loop stop; exposed for tests.
int64_t loop_period(const std::vector<int32_t>& tokens, const SamplingParams& p);

// Samples one token per row from logits [B, V] (fp32). Returns (tokens int64 [B],
// log-probs fp32 [B]). Runs on the logits' device, no host sync. Exposed for tests.
std::pair<torch::Tensor, torch::Tensor> sample_tokens(const torch::Tensor& logits, const SamplingParams& p,
                                                      int64_t valid_vocab, at::Generator& gen);

class Sampler {
 public:
  // tokenizer may be null (then stop strings are not allowed and text stays empty).
  Sampler(CausalLM model, const Tokenizer* tokenizer);
  std::vector<Completion> generate(const std::vector<std::vector<int32_t>>& prompts, const SamplingParams& p);

 private:
  CausalLM model_;
  const Tokenizer* tokenizer_;
};

}  // namespace kf::policy
