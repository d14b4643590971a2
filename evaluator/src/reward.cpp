// RewardModel: the reward of a verified result (reward.h).
#include "reward.h"

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

namespace {
double window_mean(const std::deque<double>& r, double sum) { return r.empty() ? 0 : sum / double(r.size()); }
double window_std(const std::deque<double>& r, double sum, double sum2) {
  if (r.empty()) return 0;
  const double n = double(r.size()), m = sum / n;
  return std::sqrt(std::max(0.0, sum2 / n - m * m));
}
}  // namespace

const RewardModel::Window* RewardModel::window_of(const std::string& task) const {
  const auto it = windows_.find(task);
  return it == windows_.end() ? nullptr : &it->second;
}

double RewardModel::score(Verdict v, double speedup, const std::string& task) {
  if (v != Verdict::ok) return failure_reward(v);
  if (!(speedup > 0) || !std::isfinite(speedup)) return failure_reward(Verdict::runtime_error);
  return o_.ok_bonus + speed_score(speedup, task);
}

double RewardModel::speed_score(double speedup, const std::string& task) {
  const double c = o_.clip;
  if (o_.kind == "speedup") return std::clamp(speedup - 1.0, -c, c);
  if (o_.kind == "log_speedup") return std::clamp(std::log(speedup), -c, c);
  std::lock_guard<std::mutex> lk(mu_);
  // Score against this task's statistics before this sample, then add it.
  auto& w = windows_[task];
  double r;
  const int n = int(w.recent.size());
  if (n < o_.min_samples) {
    r = std::clamp(speedup - 1.0, -c, c);
  } else {
    const double mean = window_mean(w.recent, w.sum), sd = window_std(w.recent, w.sum, w.sum2);
    r = std::clamp((speedup - mean) / std::max(sd, o_.min_std), -c, c);
  }
  w.recent.push_back(speedup);
  w.sum += speedup;
  w.sum2 += speedup * speedup;
  if (int(w.recent.size()) > o_.window) {
    w.sum -= w.recent.front();
    w.sum2 -= w.recent.front() * w.recent.front();
    w.recent.pop_front();
  }
  return r;
}

double RewardModel::score(const Result& r) {
  if (r.verdict == Verdict::ok && r.task_degenerate) return neutral_reward(r.task);
  return score(r.verdict, r.speedup, r.task);
}

double RewardModel::neutral_reward(const std::string& task) const {
  if (o_.kind != "cuda_l1") return o_.ok_bonus;  // clip(1 - 1), clip(log 1)
  std::lock_guard<std::mutex> lk(mu_);
  const Window* w = window_of(task);
  if (!w || int(w->recent.size()) < o_.min_samples) return o_.ok_bonus;
  const double mean = window_mean(w->recent, w->sum), sd = window_std(w->recent, w->sum, w->sum2);
  return o_.ok_bonus + std::clamp((1.0 - mean) / std::max(sd, o_.min_std), -o_.clip, o_.clip);
}

double RewardModel::running_mean(const std::string& task) const {
  std::lock_guard<std::mutex> lk(mu_);
  const Window* w = window_of(task);
  return w ? window_mean(w->recent, w->sum) : 0;
}
double RewardModel::running_std(const std::string& task) const {
  std::lock_guard<std::mutex> lk(mu_);
  const Window* w = window_of(task);
  return w ? window_std(w->recent, w->sum, w->sum2) : 0;
}
int RewardModel::samples(const std::string& task) const {
  std::lock_guard<std::mutex> lk(mu_);
  const Window* w = window_of(task);
  return w ? int(w->recent.size()) : 0;
}

}  // namespace kf::evaluator
