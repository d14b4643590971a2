// kf/stages/stages.h: the stages component's one public header: stages 1-2
// (docs/stages.md), which make the policy the RL stage starts from. Sections:
//   train_bpe_tokenizer                  stage 1 tokenizer
//   Corpus, load_corpus, drop_tasks      the seed corpus and its measurements
//   SftDataOptions, build_sft_examples   SFT examples in the actors' prompt format
//   train_sft, sft_shape, save_hf_policy supervised fine-tuning
//   run_selfsup                          stage 2 self-supervised rounds
// The pieces of prompt building (src/sft_data.h) stay inside stages/.
//
#pragma once
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "kf/actors/actors.h"
#include "kf/evaluator/evaluator.h"
#include "kf/policy/policy.h"

namespace kf::stages {

// --- Byte-level BPE tokenizer training (stage 1): learns merges from text and writes a
// Hugging Face tokenizer.json (Qwen2 split regex, ByteLevel pre-tokenizer and decoder,
// no normaliser, so decode(encode(x)) == x for any bytes) that both kf::policy::Tokenizer
// and HF `tokenizers` load.
// Words are split with the policy's own pre-tokeniser (the encoder's split), so every
// merge learned here is one the encoder can apply. Ids: the special tokens first
// (<|endoftext|> = 0, the EOS and padding id), then the 256 byte symbols, then one id per
// merge. Ties between equally frequent pairs go to the lower ids, so training is
// deterministic. Pure function; any thread.

struct BpeTrainOptions {
  int64_t vocab_size = 4096;  // specials + 256 bytes + merges (fewer if pairs run out)
  int64_t min_frequency = 2;  // a pair seen fewer times is never merged
  std::vector<std::string> special_tokens = {"<|endoftext|>"};
};

struct BpeTrainStats {
  int64_t words = 0, unique_words = 0, merges = 0, vocab = 0;
};

// Returns the tokenizer.json text. Throws kf::Error for a vocab_size below specials + 256.
std::string train_bpe_tokenizer(const std::vector<std::string>& texts, const BpeTrainOptions& opts,
                                BpeTrainStats* stats = nullptr);

// --- The seed corpus of stages 1-2: corpus/manifest.json lists kernels
//   [{"task", "backend": "cpu"|"cuda", "file" (relative to the corpus folder), "family",
//     "variant", "technique" (one sentence: what the kernel does to be fast)}, ...]
// and corpus/verified_<backend>.json holds the evaluator's measurements
//   {file: {"verdict", "speedup", "reason"}}.
// Entries other than kernel files (e.g. "header") are ignored. A kernel is measured when
// its verdict is one of the evaluator's (ok, compile_error, runtime_error, timeout,
// incorrect, rejected_cheat); a backend without a verified file, or another verdict
// (e.g. "compiled, not run" for CUDA kernels checked without a GPU), leaves it
// unmeasured: usable as a target, never as an exemplar (exemplars show measured speedups).
// Plain data; load once, then read from any thread.

struct CorpusKernel {
  std::string task, backend, file, family, variant, technique;
  std::string source;
  bool measured = false;  // the evaluator's verdict is recorded (see above)
  std::string verdict;    // as recorded ("ok", "incorrect", "compiled, not run", ...)
  double speedup = 0;     // (measured ok only)
  bool usable() const { return !measured || verdict == "ok"; }
};

struct Corpus {
  std::string dir;
  std::vector<CorpusKernel> kernels;                                 // manifest order
  std::vector<std::string> tasks(const std::string& backend) const;  // sorted, unique
};

// Throws kf::Error naming the file, entry index and field for a missing or malformed
// manifest, a kernel file that cannot be read, or a malformed verified file.
Corpus load_corpus(const std::string& dir);

// Removes every kernel of the named tasks (the held-out split, tasks/heldout.txt) so no
// tokenizer, example or exemplar is built from them. Returns how many were removed.
std::size_t drop_tasks(Corpus& corpus, const std::vector<std::string>& names);

// --- SFT examples (stage 1): prompt -> completion pairs in exactly the actors' format.
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
  std::string chat_vars;  // its variables (ActorOptions::chat_vars: actors.prompt.enable_thinking)
};

struct SftExample {
  std::string task, backend, file;
  std::string prompt, completion;  // completion text without the EOS token
  std::vector<int32_t> ids;        // prompt tokens, completion tokens, EOS
  int64_t prompt_len = 0;          // the loss covers ids[prompt_len..]
  int64_t exemplars_shown = 0;
};

struct SftBuildStats {
  int64_t examples = 0, skipped_unusable = 0, skipped_no_task = 0, skipped_too_long = 0;
};

// Every usable kernel of the corpus for the chosen backends becomes one contrastive
// example (when its task has other measured ok variants) plus, with no_exemplar_copy,
// one no-exemplar example. Tasks missing from tasks_dir (or without the backend's
// artifact) are skipped with one warning each.
std::vector<SftExample> build_sft_examples(const Corpus& corpus, const actors::TextCodec& codec, int32_t eos_id,
                                           const SftDataOptions& opts, SftBuildStats* stats = nullptr);

// --- Supervised fine-tuning of the policy (stage 1) and the model shapes it starts from.
// Trains a policy::CausalLM on SftExamples with AdamW (torch::optim), the loss being the
// mean cross-entropy over completion tokens only (the prompt is context, not target),
// a linear warm-up then cosine decay of the learning rate, and global gradient-norm
// clipping. Writes an HF folder (config.json, model.safetensors, tokenizer.json,
// generation_config.json, tokenizer_config.json) that transformers, policy::load_policy
// and the actors load.
// Threading: one thread drives a training run (torch intra-op threads inside).

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

// --- Stage 2, self-supervised rounds (CUDA-L1): sample N completions per task with the
// current policy (the actors' prompt with exemplars from the corpus and from kernels kept
// so far, the actors' group sampler, the actors' extractor), verify each extracted
// kernel with the real evaluator, keep the correct ones (deduplicated by source, against
// the corpus too) as new SFT examples, retrain on corpus + kept examples, repeat R times.
// Each round appends one JSON line to <out>/selfsup.jsonl and saves the policy to <out>.
// Threading: one thread; the evaluator and the model are used from it only.

struct SelfsupOptions {
  int64_t rounds = 1;
  int64_t samples = 4;               // completions per task per round (one shared prefill)
  std::string backend = "cpu";       // the evaluator backend kernels are written and verified for
  int64_t max_tasks = 0;             // 0: every corpus task of the backend
  std::vector<std::string> include;  // sample only these corpus tasks (empty: all); retraining uses every task
  double temperature = 0.8, top_p = 0.95;
  int64_t top_k = 0;  // 0: off
  int64_t max_new_tokens = 1024;
  int64_t loop_repeats = 4, loop_max_period = 128, loop_min_span = 64;  // loop stop; 0 repeats: off
  uint64_t seed = 0;
  std::string out_dir;
  // > 0: no task is sampled and no sample verified after this many seconds (the first task
  // is always sampled); the round then retrains on what it kept, and no further round
  // starts. On a shared GPU verification can take minutes a kernel: a cap keeps stage 2
  // within a run's time and still yields a policy.
  double time_limit_s = 0;
  // A verification that runs out of GPU memory (runs beside it hold the GPU) is tried
  // again, the delay x try apart; after the last try the sample counts as out_of_memory.
  int oom_attempts = 3;
  std::chrono::milliseconds oom_retry_delay{5000};
  SftDataOptions data;  // prompts (exemplars K, template, tasks dir, context)
  SftOptions train;     // retraining after each round
};

// One task's share of a round: what its prompt showed and what its samples gave. Stage 2
// shows corpus exemplars cut to the prompt budget as the actors do; per task, a cut one
// can be what makes the samples fail (116's cut prompts: 9.6 % ok in a run on the H200).
struct TaskRoundStats {
  std::string task;
  std::size_t exemplars_offered = 0, exemplars_shown = 0, exemplars_cut = 0;
  int64_t samples = 0, extracted = 0, compiled = 0, correct = 0;
  double mean_speedup_correct = 0;
  // tools/report's kinds of prompt: "no exemplars", "exemplars in full", "an exemplar cut"
  std::string prompt_kind() const;
};

struct RoundStats {
  int64_t round = 0, tasks = 0, samples = 0, extracted = 0, compiled = 0, correct = 0, kept = 0;
  int64_t unexamined = 0;     // sampled, but left unverified at the time limit (not in the rates)
  int64_t out_of_memory = 0;  // the GPU was out of memory on every try (the machine's; not in the rates)
  double mean_speedup_correct = 0;
  double sample_s = 0, eval_s = 0, train_s = 0, final_loss = 0;
  std::map<std::string, int64_t> extract_failures;  // extractor failure code -> count
  std::vector<TaskRoundStats> per_task;             // in sampling order; a task skipped by the time limit has none
  std::string json() const;                         // the selfsup.jsonl line (rates in percent of samples)
};

// Runs the rounds on `policy` (trained in place). `base` are the corpus SFT examples the
// retraining always includes. Throws kf::Error for unusable options or installation
// problems (the evaluator's); a task whose prompt does not fit is skipped with a warning.
std::vector<RoundStats> run_selfsup(policy::Policy& policy, const Corpus& corpus, const std::vector<SftExample>& base,
                                    evaluator::Evaluator& ev, const SelfsupOptions& opts);

}  // namespace kf::stages
