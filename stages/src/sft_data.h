// The pieces of an SFT example's prompt and completion (stages-internal; the public
// side is kf/stages/stages.h): exemplar draw, completion text, one task's prompt as the
// actors build it, and the actors' template and ABI text for SftDataOptions.
// Pure functions on immutable inputs; any thread.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "kf/actors/actors.h"
#include "kf/stages/stages.h"

namespace kf::stages {

// The exemplars a prompt shows: KernelDb's bucketed draw over `pool` (sorted by speedup
// here), returned in ascending speedup. All of them when pool.size() <= k.
std::vector<const CorpusKernel*> pick_exemplars(std::vector<const CorpusKernel*> pool, std::size_t k, uint64_t seed);

// The completion for `target` after a prompt that shows `shown` (ascending speedup).
std::string completion_text(const CorpusKernel& target, const std::vector<const CorpusKernel*>& shown,
                            const std::string& lang, const std::string& marker);

// Prompt text + completion -> ids and prompt length (completion encoded on its own, as
// the model continues after the prompt tokens at sampling time, then EOS).
SftExample make_example(const actors::Prompt& prompt, const std::string& completion, const actors::TextCodec& codec,
                        int32_t eos_id);

// One task's prompt as the actors build it, with exemplars drawn from `pool` (usable,
// measured kernels of that task and backend); `shown` lists the exemplars the fitted
// prompt kept (build_prompt may drop some to fit max_tokens), ascending speedup.
struct TaskPrompt {
  actors::Prompt prompt;
  std::vector<const CorpusKernel*> shown;
};
TaskPrompt task_prompt(const actors::PromptTemplate& tpl, const std::string& abi, const actors::TextCodec& codec,
                       const actors::TaskInfo& task, const std::vector<const CorpusKernel*>& pool, int64_t k,
                       uint64_t seed, std::size_t max_tokens, const SftDataOptions& opts);

// The actors' template and ABI text for these options (resolved like the actors do).
actors::PromptTemplate load_template(const SftDataOptions& opts);
std::string load_abi(const SftDataOptions& opts);

}  // namespace kf::stages
