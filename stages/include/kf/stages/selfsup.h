// Stage 2, self-supervised rounds (CUDA-L1): sample N completions per task with the
// current policy (the actors' prompt with exemplars from the corpus and from kernels kept
// so far, the actors' group sampler, the actors' extractor), verify each extracted
// kernel with the real evaluator, keep the correct ones (deduplicated by source, against
// the corpus too) as new SFT examples, retrain on corpus + kept examples, repeat R times.
// Each round appends one JSON line to <out>/selfsup.jsonl and saves the policy to <out>.
// Threading: one thread; the evaluator and the model are used from it only.
#pragma once
#include <chrono>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "kf/evaluator/evaluator.h"
#include "kf/policy/policy.h"
#include "kf/stages/corpus.h"
#include "kf/stages/sft.h"
#include "kf/stages/sft_data.h"

namespace kf::stages {

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
