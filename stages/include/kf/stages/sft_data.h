// SFT examples (stage 1): prompt -> completion pairs in exactly the actors' format.
//  - prompt: kf::actors::build_prompt over the actors' template (configs/prompts/
//    contrastive.txt) and the task's TaskInfo, with K exemplars drawn from the other
//    usable corpus variants of the same task and backend, bucketed by speedup as
//    replay::KernelDb::exemplars does for the actors (K equal-count buckets over the
//    kernels sorted by speedup, one drawn per bucket, shown slowest first). Exemplars need
//    measured speedups; a backend without measurements gets the no-exemplar prompt (the
//    prompt the actors show for an empty database).
//  - completion: analysis text built from the manifest's "technique" sentences of the
//    exemplars and the target, a plan, then the target kernel as the one fenced block the
//    actors' extractor accepts ("```<lang> <marker>"), then EOS.
// The loss covers the completion tokens (EOS included) only.
// Pure functions on immutable inputs; any thread.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "kf/actors/codec.h"
#include "kf/actors/prompt.h"
#include "kf/stages/corpus.h"

namespace kf::stages {

struct SftDataOptions {
  std::string tasks_dir;  // imported tasks (tools/import-tasks --backends ...)
  std::vector<std::string> backends = {"cpu", "cuda"};
  std::string template_path;      // empty: the tree's configs/prompts/contrastive.txt
  std::string abi_header_path;    // empty: the tree's evaluator/include/kf/kernel.h
  int64_t exemplars = 2;          // K (actors.prompt.exemplars)
  int64_t context_tokens = 4096;  // prompt + completion must fit
  // The actors fit a prompt to context - actors.sampling.max_new_tokens, whatever the
  // completion turns out to be; SFT prompts get the same cap so that the policy learns on
  // the prompts (cut or dropped exemplars included) it is shown in a run. 0: no cap beyond
  // context - completion.
  int64_t max_prompt_tokens = 0;
  int64_t min_exemplar_tokens = 64;
  bool no_exemplar_copy = true;  // also one no-exemplar example per kernel (first-round prompts)
  std::string marker = "kernel";
  uint64_t seed = 0;
  // The policy folder whose chat template renders the prompts, as the actors render them
  // (policy::ChatTemplate::for_model); empty, or a folder without one: raw text.
  std::string model_dir;
};

struct SftExample {
  std::string task, backend, file;
  std::string prompt, completion;  // completion text without the EOS token
  std::vector<int32_t> ids;        // prompt tokens, completion tokens, EOS
  int64_t prompt_len = 0;          // the loss covers ids[prompt_len..]
  int64_t exemplars_shown = 0;
};

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

struct SftBuildStats {
  int64_t examples = 0, skipped_unusable = 0, skipped_no_task = 0, skipped_too_long = 0;
};

// Every usable kernel of the corpus for the chosen backends becomes one contrastive
// example (when its task has other measured ok variants) plus, with no_exemplar_copy,
// one no-exemplar example. Tasks missing from tasks_dir (or without the backend's
// artifact) are skipped with one warning each.
std::vector<SftExample> build_sft_examples(const Corpus& corpus, const actors::TextCodec& codec, int32_t eos_id,
                                           const SftDataOptions& opts, SftBuildStats* stats = nullptr);

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
