#include "group_sampler.h"

#include "kf/common/error.h"

namespace kf::actors {

std::vector<policy::Completion> sample_group(policy::CausalLM& model, const std::vector<int32_t>& prompt, int64_t G,
                                             const policy::SamplingParams& p, int64_t valid_vocab,
                                             bool shared_prefill) {
  if (G < 1) throw Error("sample_group: group size must be >= 1");
  if (prompt.empty()) throw Error("sample_group: empty prompt");
  if (p.max_new_tokens <= 0) throw Error("sample_group: max_new_tokens must be positive");
  if (!p.stop.empty()) throw Error("sample_group: stop strings are not supported (use eos_ids)");
  // One decode loop for every sampler: policy::Sampler (fixed-shape steps replayed as a
  // CUDA graph on a GPU), with the prompt prefilled once when shared_prefill is set.
  policy::SamplingParams q = p;
  q.valid_vocab = valid_vocab;
  q.shared_prefill = shared_prefill;
  policy::Sampler s(model, nullptr);
  return s.generate(std::vector<std::vector<int32_t>>(static_cast<std::size_t>(G), prompt), q);
}

}  // namespace kf::actors
