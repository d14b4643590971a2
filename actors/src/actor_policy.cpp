// The actor's copy of the policy (ActorPolicy): the learner's initial weights, or a model the
// caller built, with its text codec, EOS ids and sampleable vocabulary.
#include "kf/actors/actors.h"

#include <torch/cuda.h>

#include "kf/common/error.h"
#include "kf/policy/policy.h"

namespace kf::actors {

policy::ModelConfig init_shape_config(const std::string& name) { return policy::named_model_shape(name); }

ActorPolicy make_actor_policy(policy::CausalLM model, const policy::Tokenizer* tok) {
  ActorPolicy p;
  p.config = model->config();
  p.model = model;
  p.model->eval();
  p.eos_ids = p.config.eos_token_ids;
  if (tok) {
    p.codec = TextCodec::bpe(*tok);
    p.valid_vocab = std::min<int64_t>(tok->vocab_size(), p.config.vocab_size);
  } else {
    if (p.config.vocab_size > 512)
      throw Error("actor policy: a model with vocab " + std::to_string(p.config.vocab_size) +
                  " needs a tokenizer.json (only byte-level models, vocab <= 256, run without one)");
    p.codec = TextCodec::bytes();
    p.valid_vocab = std::min<int64_t>(256, p.config.vocab_size);
  }
  return p;
}

ActorPolicy load_actor_policy(const std::string& policy_dir, const std::string& init_shape, uint64_t seed,
                              const std::string& device) {
  const torch::Device dev(device);
  if (dev.is_cuda() && !torch::cuda::is_available())
    throw Error("actors.device: '" + device + "' but no CUDA device is visible");
  if (!policy_dir.empty()) {
    auto p = policy::load_policy(policy_dir, dev);
    return make_actor_policy(p.model, p.tokenizer ? &*p.tokenizer : nullptr);
  }
  const auto c = init_shape_config(init_shape);
  // Same seed as the learner's random init (on CPU the same model as its version 0; the
  // learner publishes its weights at start anyway).
  policy::CausalLM m(c, torch::TensorOptions().dtype(dev.is_cuda() ? torch::kBFloat16 : torch::kFloat32).device(dev));
  m->init_random(seed);
  return make_actor_policy(m, nullptr);
}

}  // namespace kf::actors
