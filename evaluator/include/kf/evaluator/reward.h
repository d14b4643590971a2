// Reward of a verified result, for the learner.
//
// Default (kind "cuda_l1", after CUDA-L1): raw score = speedup; normalised with running
// statistics (mean, std) of the raw scores of the last `window` ok results, and clipped
// to [-clip, clip]. Until `min_samples` are seen, the score is clip(speedup - 1).
// Failure verdicts get fixed rewards, below -clip by default so that a slow correct
// kernel always beats a broken one.
// Other kinds: "speedup" (clip(speedup - 1)), "log_speedup" (clip(log speedup)).
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
  double score(const Result& r) { return score(r.verdict, r.speedup); }
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
