// Reward of a verified result, for the learner.
//
// Default (kind "cuda_l1", after CUDA-L1): raw score = speedup; normalised with running
// statistics (mean, std) of the raw scores of the last `window` ok results, and clipped
// to [-clip, clip]. Until `min_samples` are seen, the score is clip(speedup - 1).
// Failure verdicts get fixed rewards, below -clip by default so that a slow correct
// kernel always beats a broken one.
// Other kinds: "speedup" (clip(speedup - 1)), "log_speedup" (clip(log speedup)).
//
// A result on a degenerate task (Result::task_degenerate: the reference output barely
// depends on the inputs, so a kernel that returns a constant can pass) earns no speed
// reward: it is scored as speedup 1.0 under the configured kind (0 for "speedup" and
// "log_speedup"; for "cuda_l1" the normalised score of 1.0, without adding the sample
// to the running statistics), whatever speedup it measured.
//
// Threading: RewardModel is thread-safe (one mutex).
#pragma once
#include <deque>
#include <mutex>
#include <string>

#include "kf/evaluator/result.h"

namespace kf::evaluator {

struct RewardOptions {
  std::string kind = "cuda_l1";
  double clip = 2.0;
  int window = 1024;
  int min_samples = 16;
  double min_std = 0.05;
  double compile_error = -3.0, runtime_error = -3.0, timeout = -3.0, incorrect = -3.0, rejected_cheat = -4.0;
};

class RewardModel {
 public:
  explicit RewardModel(RewardOptions o = {});
  // Scores one result (and, for ok results, updates the running statistics).
  double score(Verdict v, double speedup);
  // As above, and a degenerate task's ok result gets neutral_reward().
  double score(const Result& r);
  // The reward of speedup 1.0 under the configured kind, without updating the statistics.
  double neutral_reward() const;
  double failure_reward(Verdict v) const;
  double running_mean() const;
  double running_std() const;
  int samples() const;

 private:
  RewardOptions o_;
  mutable std::mutex mu_;
  std::deque<double> recent_;
  double sum_ = 0, sum2_ = 0;
};

}  // namespace kf::evaluator
