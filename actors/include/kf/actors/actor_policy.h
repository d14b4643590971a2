// The actor's copy of the policy: model, text codec, EOS ids and the sampleable vocab.
// Initial weights are the learner's (learner.policy folder, or a seeded random init of
// learner.init_shape with run.seed, which equals the learner's version 0); snapshots
// then replace them (weights_blob.h).
// One thread drives an ActorPolicy.
#pragma once
#include <string>
#include <vector>

#include "kf/actors/codec.h"
#include "kf/policy/policy.h"

namespace kf::actors {

struct ActorPolicy {
  policy::ModelConfig config;
  policy::CausalLM model{nullptr};
  TextCodec codec = TextCodec::bytes();
  std::vector<int64_t> eos_ids;
  int64_t valid_vocab = 0;
};

// The random-init shapes the learner knows (kept equal to learner.cpp's model_shape;
// a drift shows up as snapshots rejected for a shape mismatch).
policy::ModelConfig init_shape_config(const std::string& name);

// device: "cpu", "cuda", "cuda:N". bf16 on CUDA, fp32 on CPU. A model without
// tokenizer.json must be byte-level (vocab <= 256 + padding); otherwise kf::Error.
ActorPolicy load_actor_policy(const std::string& policy_dir, const std::string& init_shape, uint64_t seed,
                              const std::string& device);
// A policy around a model the caller built (tests, serial mode); byte codec if tok is null.
ActorPolicy make_actor_policy(policy::CausalLM model, const policy::Tokenizer* tok);

}  // namespace kf::actors
