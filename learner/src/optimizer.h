// AdamW with decoupled weight decay, a warm-up + decay learning-rate schedule and global
// gradient-norm clipping, over a named parameter list.
//
// Why our own AdamW and not torch::optim::AdamW: its state is keyed by tensor address,
// which a checkpoint cannot name; ours keeps (exp_avg, exp_avg_sq) per parameter name in
// fp32, so a checkpoint stores them bitwise and resume is exact. The update is
// torch::optim::AdamW's (bias-corrected, eps outside the sqrt). A non-fp32 (bf16)
// parameter gets an fp32 master copy that the update runs on; the parameter then takes
// the master's rounded value (learner.param_dtype: bf16), sharded or not.
//
// Sharded (ZeRO style, learner.dist.shard: optimizer): built over sharded GradBuckets,
// each rank keeps fp32 master weights and both moments only for its slice of every
// bucket (1/world of the padded flat parameter buffer). fp32 parameters are their own
// master (the slice of the parameter bucket, no copy); other dtypes get an fp32 copy.
// step() updates the slice from the reduce-scattered gradient and all-gathers every
// parameter bucket; clip_grad_norm() all-reduces the shards' sums of squares; state()
// all-gathers the moments to rank 0 as whole per-parameter tensors, so a checkpoint has
// the same format sharded or not, and loads at any world size (each rank takes its slice
// of the full tensors in load_state_tensor). With sharded parameters (shard: params) the
// slice is the one the buckets keep and step() gathers nothing. step, clip_grad_norm and state are
// collective in sharded mode: every rank calls them in the same order.
// Threading: one thread (the learner's).
#pragma once
#include <torch/torch.h>

#include <string>
#include <vector>

#include "kf/learner/learner.h"

namespace kf::learner {

class GradBuckets;

// Learning rate at optimizer step `step` (0-based): linear warm-up to lr over
// warmup_steps, then constant, or linear/cosine decay to lr * min_lr_ratio at total_steps.
double schedule_lr(const OptimConfig& o, const ScheduleConfig& s, int64_t step);

class AdamW {
 public:
  // sharded: GradBuckets built with sharded = true over the same params (it owns the
  // layout and the parameter storage); nullptr or an unsharded one: plain AdamW.
  AdamW(std::vector<std::pair<std::string, torch::Tensor>> params, OptimConfig cfg, GradBuckets* sharded = nullptr);

  // One update with learning rate lr from the parameters' .grad (fp32). Parameters
  // without a grad are skipped. Sharded: from the owned gradient slices, then all-gather.
  void step(double lr);
  int64_t steps() const { return steps_; }

  // The global gradient norm (sharded: over all ranks' slices) and the clip to max_norm,
  // as the free clip_grad_norm below.
  double clip_grad_norm(double max_norm);

  // State for checkpoints: "<name>.exp_avg", "<name>.exp_avg_sq" (fp32, parameter
  // device; sharded: gathered, on CPU, rank 0 only, others get an empty list) and, for
  // non-fp32 parameters (sharded or not), the fp32 "<name>.master".
  std::vector<std::pair<std::string, torch::Tensor>> state() const;
  void set_steps(int64_t n) { steps_ = n; }
  // Copies a state tensor (whole, as state() names it) in place; sharded: this rank's
  // slice of it. Throws kf::Error naming the tensor if unknown or of the wrong shape.
  void load_state_tensor(const std::string& name, const torch::Tensor& value);
  // A parameter's value as a checkpoint stores it (any dtype, whole tensor): starts its fp32
  // master, when it has one of its own, from that value at full precision. Call after
  // loading the parameter and before load_state_tensor ("<name>.master" then wins).
  void load_param_value(const std::string& name, const torch::Tensor& value);

  const std::vector<std::pair<std::string, torch::Tensor>>& params() const { return params_; }
  bool sharded() const { return shard_ != nullptr; }
  // fp32 bytes this rank holds for the optimizer: moments plus separate master copies.
  int64_t state_bytes() const;

 private:
  void step_sharded(double lr);
  // OptimConfig::fused_cuda and the parameters on a CUDA device.
  bool fused() const { return cfg_.fused_cuda && !params_.empty() && params_[0].second.is_cuda(); }
  std::vector<std::pair<std::string, torch::Tensor>> params_;
  std::vector<torch::Tensor> exp_avg_, exp_avg_sq_;  // per parameter, or per bucket slice
  std::vector<torch::Tensor> master_;                // sharded: per bucket slice
  std::vector<torch::Tensor> param_master_;          // unsharded: fp32 master per non-fp32 parameter
  bool master_is_param_ = true;                      // sharded fp32: master_ views the parameters
  GradBuckets* shard_ = nullptr;
  OptimConfig cfg_;
  int64_t steps_ = 0;
};

// Global L2 norm of the gradients (squares summed in fp64); if max_norm > 0 and the norm
// exceeds it, scales every gradient by max_norm / (norm + 1e-6) (torch's
// clip_grad_norm_). Returns the norm before.
// fused_cuda: CUDA gradients' norms by one _foreach_norm and the scale by _foreach_mul_.
double clip_grad_norm(const std::vector<torch::Tensor>& params, double max_norm, bool fused_cuda = true);

}  // namespace kf::learner
