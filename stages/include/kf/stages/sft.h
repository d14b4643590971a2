// Supervised fine-tuning of the policy (stage 1) and the model shapes it starts from.
// Trains a policy::CausalLM on SftExamples with AdamW (torch::optim), the loss being the
// mean cross-entropy over completion tokens only (the prompt is context, not target),
// a linear warm-up then cosine decay of the learning rate, and global gradient-norm
// clipping. Writes an HF folder (config.json, model.safetensors, tokenizer.json,
// generation_config.json, tokenizer_config.json) that transformers, policy::load_policy
// and the actors load.
// Threading: one thread drives a training run (torch intra-op threads inside).
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "kf/policy/policy.h"
#include "kf/stages/sft_data.h"

namespace kf::stages {

// Qwen2-style shapes for a fresh policy: "tiny" (tests, ~0.2 M + embeddings), "small"
// (the shipped default, ~6 M at vocab 4096), "medium" (~14 M). vocab and context are the
// caller's. Throws kf::Error naming --shape for an unknown name.
policy::ModelConfig sft_shape(const std::string& name, int64_t vocab, int64_t max_positions, int64_t eos_id);
int64_t parameter_count(policy::CausalLM& model);

// The --device value of tools/sft and tools/selfsup ("cpu", "cuda", "cuda:N"). Throws
// kf::Error naming --device for a malformed value or a GPU that is not there.
torch::Device parse_device_option(const std::string& value);

struct SftOptions {
  int64_t steps = 200;  // optimizer steps
  int64_t batch = 4;    // sequences per step (gradient accumulation, one at a time)
  double lr = 1e-3, min_lr_ratio = 0.1, weight_decay = 0.1, grad_clip = 1.0;
  int64_t warmup_steps = 20;
  uint64_t seed = 0;
  int threads = 0;  // torch intra-op threads; 0: leave as is
  int64_t log_every = 1;
  double time_limit_s = 0;  // > 0: stop early once exceeded (the run says so); the cosine
                            // then decays over whichever of steps or time ends first
};

struct SftStepLog {
  int64_t step = 0;
  double loss = 0, lr = 0, grad_norm = 0, seconds = 0;
  int64_t tokens = 0;  // completion tokens in the step
};

struct SftReport {
  int64_t steps = 0;
  double first_loss = 0, final_loss = 0;  // final: mean of the last min(10, steps) steps
  double seconds = 0;
  bool stopped_by_time = false;
};

// Mean completion-token cross-entropy of one example (no grad), for tests and reports.
double example_loss(policy::CausalLM& model, const SftExample& ex);

// Trains in place; `on_step` (optional) sees each step's log.
SftReport train_sft(policy::CausalLM& model, const std::vector<SftExample>& examples, const SftOptions& opts,
                    const std::function<void(const SftStepLog&)>& on_step = {});

// save_policy plus generation_config.json and tokenizer_config.json.
void save_hf_policy(const policy::Policy& p, const std::string& dir, int64_t max_new_tokens = 1024);

}  // namespace kf::stages
