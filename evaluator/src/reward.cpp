#include "kf/evaluator/evaluator.h"

#include <algorithm>
#include <cmath>

#include "kf/common/error.h"

namespace kf::evaluator {

RewardModel::RewardModel(RewardOptions o) : o_(std::move(o)) {
  if (o_.kind != "cuda_l1" && o_.kind != "speedup" && o_.kind != "log_speedup")
    throw error_at("evaluator.reward.kind", "unknown reward kind '" + o_.kind + "' (cuda_l1, speedup, log_speedup)");
  if (o_.clip <= 0 || o_.window < 1) throw error_at("evaluator.reward", "clip must be > 0 and window >= 1");
}

double RewardModel::failure_reward(Verdict v) const {
  switch (v) {
    case Verdict::compile_error:
      return o_.compile_error;
    case Verdict::runtime_error:
      return o_.runtime_error;
    case Verdict::timeout:
      return o_.timeout;
    case Verdict::incorrect:
      return o_.incorrect;
    case Verdict::rejected_cheat:
      return o_.rejected_cheat;
    case Verdict::ok:
      return 0;
  }
  return 0;
}

double RewardModel::score(Verdict v, double speedup) {
  if (v != Verdict::ok) return failure_reward(v);
  const double c = o_.clip;
  if (!(speedup > 0) || !std::isfinite(speedup)) return failure_reward(Verdict::runtime_error);
  if (o_.kind == "speedup") return std::clamp(speedup - 1.0, -c, c);
  if (o_.kind == "log_speedup") return std::clamp(std::log(speedup), -c, c);
  std::lock_guard<std::mutex> lk(mu_);
  // Score against the statistics before this sample, then add it.
  double r;
  const int n = int(recent_.size());
  if (n < o_.min_samples) {
    r = std::clamp(speedup - 1.0, -c, c);
  } else {
    const double mean = sum_ / n;
    const double var = std::max(0.0, sum2_ / n - mean * mean);
    r = std::clamp((speedup - mean) / std::max(std::sqrt(var), o_.min_std), -c, c);
  }
  recent_.push_back(speedup);
  sum_ += speedup;
  sum2_ += speedup * speedup;
  if (int(recent_.size()) > o_.window) {
    sum_ -= recent_.front();
    sum2_ -= recent_.front() * recent_.front();
    recent_.pop_front();
  }
  return r;
}

double RewardModel::score(const Result& r) {
  if (r.verdict == Verdict::ok && r.task_degenerate) return neutral_reward();
  return score(r.verdict, r.speedup);
}

double RewardModel::neutral_reward() const {
  if (o_.kind != "cuda_l1") return 0;  // clip(1 - 1), clip(log 1)
  std::lock_guard<std::mutex> lk(mu_);
  const int n = int(recent_.size());
  if (n < o_.min_samples) return 0;
  const double mean = sum_ / n;
  const double var = std::max(0.0, sum2_ / n - mean * mean);
  return std::clamp((1.0 - mean) / std::max(std::sqrt(var), o_.min_std), -o_.clip, o_.clip);
}

double RewardModel::running_mean() const {
  std::lock_guard<std::mutex> lk(mu_);
  return recent_.empty() ? 0 : sum_ / double(recent_.size());
}
double RewardModel::running_std() const {
  std::lock_guard<std::mutex> lk(mu_);
  if (recent_.empty()) return 0;
  const double n = double(recent_.size()), m = sum_ / n;
  return std::sqrt(std::max(0.0, sum2_ / n - m * m));
}
int RewardModel::samples() const {
  std::lock_guard<std::mutex> lk(mu_);
  return int(recent_.size());
}

}  // namespace kf::evaluator
