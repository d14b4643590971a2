#include "loss.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace kf::learner {

std::vector<double> group_advantages(const std::vector<double>& rewards, bool std_normalize, double eps) {
  std::vector<double> a(rewards.size(), 0.0);
  if (rewards.empty()) return a;
  const double n = static_cast<double>(rewards.size());
  const double mean = std::accumulate(rewards.begin(), rewards.end(), 0.0) / n;
  double var = 0;
  for (double r : rewards) var += (r - mean) * (r - mean);
  const double sd = std::sqrt(var / n);
  for (std::size_t i = 0; i < rewards.size(); ++i)
    a[i] = std_normalize ? (rewards[i] - mean) / (sd + eps) : rewards[i] - mean;
  return a;
}

bool rewards_all_equal(const std::vector<double>& rewards) {
  if (rewards.size() < 2) return true;
  for (double r : rewards)
    if (r != rewards[0]) return false;
  return true;
}

GrpoLoss grpo_loss(const torch::Tensor& logp, const torch::Tensor& behaviour, const torch::Tensor& ref,
                   const torch::Tensor& advantages, const torch::Tensor& weight, const GrpoConfig& cfg) {
  // [B]: one advantage per row; [B, T]: per position (packed rows hold several sequences).
  const auto A = advantages.dim() == 1 ? advantages.to(logp.dtype()).unsqueeze(1) : advantages.to(logp.dtype());
  const auto beh = behaviour.to(logp.dtype());
  torch::Tensor prox, w;
  if (cfg.ratio == RatioMode::decoupled) {
    prox = logp.detach();
    w = torch::exp(prox - beh).clamp_max(cfg.behaviour_weight_cap);
  } else {
    prox = beh;
    w = torch::ones_like(logp);
  }
  const auto r = torch::exp(logp - prox);
  const auto unclipped = r * A;
  const auto clipped_r = r.clamp(1.0 - cfg.clip_low, 1.0 + cfg.clip_high);
  const auto clipped = clipped_r * A;
  const auto pg = -w * torch::min(unclipped, clipped);
  GrpoLoss out;
  auto per_token = pg;
  if (cfg.kl_coef != 0.0 && ref.defined()) {
    const auto d = ref.to(logp.dtype()) - logp;
    const auto kl = torch::exp(d) - d - 1.0;
    per_token = per_token + cfg.kl_coef * kl;
    out.kl = (weight * kl).sum().detach();
  } else {
    out.kl = torch::zeros({}, logp.options());
  }
  out.loss = (weight * per_token).sum();
  // The clip is active where the clipped term is the smaller one (the gradient is cut).
  const auto active = (clipped < unclipped).to(logp.dtype());
  out.clipped = (weight * active).sum().detach();
  out.ratio = (weight * r).sum().detach();
  return out;
}

torch::Tensor pairwise_loss(const torch::Tensor& seq_logp, const torch::Tensor& seq_ref,
                            const std::vector<std::pair<int64_t, int64_t>>& pairs, double beta, double pair_weight) {
  if (pairs.empty()) return torch::zeros({}, seq_logp.options());
  std::vector<int64_t> win, lose;
  for (const auto& p : pairs) {
    win.push_back(p.first);
    lose.push_back(p.second);
  }
  const auto opts = torch::TensorOptions().dtype(torch::kInt64).device(seq_logp.device());
  const auto wi = torch::tensor(win, opts), li = torch::tensor(lose, opts);
  const auto ref = seq_ref.to(seq_logp.dtype());
  const auto margin = (seq_logp.index_select(0, wi) - ref.index_select(0, wi)) -
                      (seq_logp.index_select(0, li) - ref.index_select(0, li));
  return -torch::nn::functional::logsigmoid(beta * margin).sum() * pair_weight;
}

std::vector<std::pair<int64_t, int64_t>> select_pairs(const std::vector<double>& rewards, int64_t max_pairs,
                                                      double min_gap) {
  std::vector<int64_t> order(rewards.size());
  std::iota(order.begin(), order.end(), 0);
  // Stable: equal rewards keep their index order, so the choice is reproducible.
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return rewards[a] > rewards[b]; });
  std::vector<std::pair<int64_t, int64_t>> pairs;
  const std::size_t n = order.size();
  for (std::size_t i = 0; i < n / 2 && static_cast<int64_t>(pairs.size()) < max_pairs; ++i) {
    const int64_t hi = order[i], lo = order[n - 1 - i];
    if (rewards[hi] - rewards[lo] > min_gap) pairs.emplace_back(hi, lo);
  }
  return pairs;
}

}  // namespace kf::learner
