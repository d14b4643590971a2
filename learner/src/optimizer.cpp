#include "kf/learner/optimizer.h"

#include <cmath>

#include "kf/common/error.h"

namespace kf::learner {

double schedule_lr(const OptimConfig& o, const ScheduleConfig& s, int64_t step) {
  if (s.warmup_steps > 0 && step < s.warmup_steps) return o.lr * static_cast<double>(step + 1) / s.warmup_steps;
  if (s.kind == ScheduleKind::constant) return o.lr;
  const int64_t span = std::max<int64_t>(1, s.total_steps - s.warmup_steps);
  const double p = std::min(1.0, static_cast<double>(step - s.warmup_steps) / span);
  const double lo = o.lr * s.min_lr_ratio;
  if (s.kind == ScheduleKind::linear) return o.lr + (lo - o.lr) * p;
  return lo + 0.5 * (o.lr - lo) * (1.0 + std::cos(M_PI * p));
}

AdamW::AdamW(std::vector<std::pair<std::string, torch::Tensor>> params, OptimConfig cfg)
    : params_(std::move(params)), cfg_(cfg) {
  torch::NoGradGuard ng;
  for (const auto& p : params_) {
    exp_avg_.push_back(torch::zeros_like(p.second, p.second.options().dtype(torch::kFloat32)));
    exp_avg_sq_.push_back(torch::zeros_like(p.second, p.second.options().dtype(torch::kFloat32)));
  }
}

void AdamW::step(double lr) {
  torch::NoGradGuard ng;
  ++steps_;
  const double bc1 = 1.0 - std::pow(cfg_.beta1, static_cast<double>(steps_));
  const double bc2 = 1.0 - std::pow(cfg_.beta2, static_cast<double>(steps_));
  const double step_size = lr / bc1;
  const double bc2_sqrt = std::sqrt(bc2);
  for (std::size_t i = 0; i < params_.size(); ++i) {
    auto& p = params_[i].second;
    const auto& g0 = p.grad();
    if (!g0.defined()) continue;
    const auto g = g0.to(torch::kFloat32);
    if (cfg_.weight_decay != 0.0) p.mul_(1.0 - lr * cfg_.weight_decay);
    exp_avg_[i].lerp_(g, 1.0 - cfg_.beta1);
    exp_avg_sq_[i].mul_(cfg_.beta2).addcmul_(g, g, 1.0 - cfg_.beta2);
    const auto denom = (exp_avg_sq_[i].sqrt() / bc2_sqrt).add_(cfg_.eps);
    if (p.scalar_type() == torch::kFloat32) {
      p.addcdiv_(exp_avg_[i], denom, -step_size);
    } else {
      p.copy_(p.to(torch::kFloat32).addcdiv_(exp_avg_[i], denom, -step_size));
    }
  }
}

std::vector<std::pair<std::string, torch::Tensor>> AdamW::state() const {
  std::vector<std::pair<std::string, torch::Tensor>> out;
  for (std::size_t i = 0; i < params_.size(); ++i) {
    out.emplace_back(params_[i].first + ".exp_avg", exp_avg_[i]);
    out.emplace_back(params_[i].first + ".exp_avg_sq", exp_avg_sq_[i]);
  }
  return out;
}

void AdamW::load_state_tensor(const std::string& name, const torch::Tensor& value) {
  torch::NoGradGuard ng;
  for (std::size_t i = 0; i < params_.size(); ++i) {
    const auto& pn = params_[i].first;
    torch::Tensor* dst = nullptr;
    if (name == pn + ".exp_avg") dst = &exp_avg_[i];
    else if (name == pn + ".exp_avg_sq") dst = &exp_avg_sq_[i];
    if (!dst) continue;
    if (dst->sizes() != value.sizes())
      throw Error("optimizer state '" + name + "': shape mismatch with its parameter");
    dst->copy_(value);
    return;
  }
  throw Error("optimizer state '" + name + "': no such parameter");
}

double clip_grad_norm(const std::vector<torch::Tensor>& params, double max_norm) {
  torch::NoGradGuard ng;
  torch::Tensor total;
  for (const auto& p : params) {
    if (!p.grad().defined()) continue;
    const auto s = p.grad().to(torch::kFloat32).pow(2).sum();
    total = total.defined() ? total + s : s;
  }
  if (!total.defined()) return 0.0;
  const double norm = std::sqrt(total.item<double>());
  if (max_norm > 0 && norm > max_norm) {
    const double scale = max_norm / (norm + 1e-6);
    for (const auto& p : params)
      if (p.grad().defined()) p.grad().mul_(scale);
  }
  return norm;
}

}  // namespace kf::learner
