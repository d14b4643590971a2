// RewardModel (reward.cpp): the reward of a verified result, for the learner. Its settings
// (RewardOptions) are public, held by EvalOptions; the model is reached through
// Evaluator::reward_model().
//
// Default (kind "cuda_l1", after CUDA-L1): raw score = speedup; normalised with running
// statistics (mean, std) of the raw scores of the last `window` ok results OF THE SAME
// TASK, and clipped to [-clip, clip]. Until the task has `min_samples`, the score is
// clip(speedup - 1). Per task because the point is to compare a kernel with its peers on
// the same problem: pooled statistics let a task with naturally large speedups set the
// scale for all, and scored members of one group against different means.
// Failure verdicts get fixed rewards, below -clip by default so that a slow correct
// kernel always beats a broken one.
// Other kinds: "speedup" (clip(speedup - 1)), "log_speedup" (clip(log speedup)).
// `ok_bonus` is added to every ok result's reward in every kind (default 0): a term for
// correctness alone, so that a slow correct kernel is clearly above a broken one.
//
// A result on a degenerate task (Result::task_degenerate: the reference output barely
// depends on the inputs, so a kernel that returns a constant can pass) earns no speed
// reward: it is scored as speedup 1.0 under the configured kind (0 for "speedup" and
// "log_speedup"; for "cuda_l1" the normalised score of 1.0, without adding the sample
// to the running statistics), whatever speedup it measured.
//
// Threading: RewardModel is thread-safe (one mutex). Torch-free.
#pragma once
#include <deque>
#include <map>
#include <mutex>
#include <string>

#include "kf/evaluator/evaluator.h"

namespace kf::evaluator {

class RewardModel {
 public:
  explicit RewardModel(RewardOptions o = {});
  // Scores one result of `task` (and, for ok results, updates that task's statistics).
  double score(Verdict v, double speedup, const std::string& task = "");
  // As above (task: r.task), and a degenerate task's ok result gets neutral_reward().
  double score(const Result& r);
  // The reward of speedup 1.0 on `task` under the configured kind, without updating the statistics.
  double neutral_reward(const std::string& task = "") const;
  double failure_reward(Verdict v) const;
  // The running statistics of one task's ok speedups (cuda_l1).
  double running_mean(const std::string& task = "") const;
  double running_std(const std::string& task = "") const;
  int samples(const std::string& task = "") const;

 private:
  struct Window {
    std::deque<double> recent;
    double sum = 0, sum2 = 0;
  };
  const Window* window_of(const std::string& task) const;       // null when the task has none; mu_ held
  double speed_score(double speedup, const std::string& task);  // the kind's score, without ok_bonus
  RewardOptions o_;
  mutable std::mutex mu_;
  std::map<std::string, Window> windows_;
};

}  // namespace kf::evaluator
