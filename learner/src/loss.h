// The training objectives as pure tensor functions, so tests can check them on
// hand-computed cases without a model.
//
// GRPO (CUDA-L1 stage 3): a group's advantages are its rewards minus their mean
// (optionally over their std). Per completion token t of a sequence with advantage A:
//   r_t   = exp(logp_t - prox_t)                         importance ratio
//   w_t   = min(exp(prox_t - behaviour_t), cap)          decoupled only (AReaL), else 1
//   pg_t  = -w_t * min(r_t * A, clip(r_t, 1 - clip_low, 1 + clip_high) * A)
//   kl_t  = exp(ref_t - logp_t) - (ref_t - logp_t) - 1  k3 estimator, when kl_coef > 0
//   loss  = sum_t weight_t * (pg_t + kl_coef * kl_t)
// prox is the behaviour log-prob (ratio "behaviour": clip against the sampler) or the
// current policy's own detached log-prob (ratio "decoupled": one update per batch, so
// the proximal policy is the current one; the clip then binds only across updates and
// the stale-sample weight w carries the off-policy correction, capped).
// `weight` holds mask and aggregation together: 1/N_tokens (token-level) or
// 1/(len_i * N_seqs) (sequence-level), 0 on prompt and padding, with N over all ranks,
// so summed per-rank gradients equal the gradient of the whole batch.
//
// Pairwise (DPO-style) on (faster, slower) completions of one prompt:
//   loss = sum_p weight_p * -log sigmoid(beta * ((lw - rw) - (ll - rl)))
// with l* the policy's and r* the frozen reference's completion log-prob sums.
// Plain functions; any thread.
#pragma once
#include <torch/torch.h>

#include <utility>
#include <vector>

#include "kf/learner/learner.h"

namespace kf::learner {

// Mean-centred rewards, divided by (population std + eps) when std_normalize.
std::vector<double> group_advantages(const std::vector<double>& rewards, bool std_normalize, double eps);
// True when a group carries no signal (all rewards equal, or fewer than two).
bool rewards_all_equal(const std::vector<double>& rewards);

struct GrpoLoss {
  torch::Tensor loss;     // scalar, differentiable
  torch::Tensor clipped;  // scalar: sum of weight over tokens whose clip was active
  torch::Tensor kl;       // scalar: sum of weight * kl_t (0 without reference)
  torch::Tensor ratio;    // scalar: sum of weight * r_t
};

// logp: [B, T] differentiable fp32; behaviour, weight: [B, T]; ref: [B, T] or undefined;
// advantages: [B] (one per row) or [B, T] (per position). All on one device.
GrpoLoss grpo_loss(const torch::Tensor& logp, const torch::Tensor& behaviour, const torch::Tensor& ref,
                   const torch::Tensor& advantages, const torch::Tensor& weight, const GrpoConfig& cfg);

// seq_logp, seq_ref: [N] completion log-prob sums (policy differentiable); pairs index
// them as (faster, slower); pair_weight: the per-pair weight (1 / global pair count).
torch::Tensor pairwise_loss(const torch::Tensor& seq_logp, const torch::Tensor& seq_ref,
                            const std::vector<std::pair<int64_t, int64_t>>& pairs, double beta, double pair_weight);

// (faster, slower) pairs of one group by reward: the best with the worst, the second
// best with the second worst, ..., each with a reward gap > min_gap, at most max_pairs.
std::vector<std::pair<int64_t, int64_t>> select_pairs(const std::vector<double>& rewards, int64_t max_pairs,
                                                      double min_gap);

}  // namespace kf::learner
