// One rollout: G completions of a prompt as samples (text without the stopping EOS, the
// extracted kernel); actors, tools/optimize and tools/selfsup all sample through it.
#include "kf/actors/actors.h"

#include <torch/torch.h>

#include "group_sampler.h"

namespace kf::actors {

std::string completion_text(const TextCodec& codec, const policy::Completion& c) {
  if (c.finish_reason == "eos" && !c.tokens.empty())
    return codec.decode(std::vector<int32_t>(c.tokens.begin(), c.tokens.end() - 1));
  return codec.decode(c.tokens);
}

std::vector<RolloutSample> rollout_group(policy::CausalLM& model, const TextCodec& codec,
                                         const std::vector<int32_t>& prompt, int64_t G,
                                         const policy::SamplingParams& sampling, int64_t valid_vocab,
                                         const ExtractOptions& extract, bool shared_prefill) {
  std::vector<policy::Completion> completions;
  {
    torch::NoGradGuard no_grad;
    completions = sample_group(model, prompt, G, sampling, valid_vocab, shared_prefill);
  }
  return rollout_samples(codec, std::move(completions), extract);
}

std::vector<RolloutSample> rollout_samples(const TextCodec& codec, std::vector<policy::Completion> completions,
                                           const ExtractOptions& extract) {
  std::vector<RolloutSample> out(completions.size());
  for (std::size_t i = 0; i < completions.size(); ++i) {
    out[i].text = completion_text(codec, completions[i]);
    out[i].kernel = extract_kernel(out[i].text, extract);
    out[i].completion = std::move(completions[i]);
  }
  return out;
}

}  // namespace kf::actors
