// AdamW with decoupled weight decay, a warm-up + decay learning-rate schedule and global
// gradient-norm clipping, over a named parameter list.
//
// Why our own AdamW and not torch::optim::AdamW: its state is keyed by tensor address,
// which a checkpoint cannot name; ours keeps (exp_avg, exp_avg_sq) per parameter name in
// fp32, so a checkpoint stores them bitwise and resume is exact. The update is
// torch::optim::AdamW's (bias-corrected, eps outside the sqrt).
// Threading: one thread (the learner's).
#pragma once
#include <torch/torch.h>

#include <string>
#include <vector>

#include "kf/learner/learner_config.h"

namespace kf::learner {

// Learning rate at optimizer step `step` (0-based): linear warm-up to lr over
// warmup_steps, then constant, or linear/cosine decay to lr * min_lr_ratio at total_steps.
double schedule_lr(const OptimConfig& o, const ScheduleConfig& s, int64_t step);

class AdamW {
 public:
  AdamW(std::vector<std::pair<std::string, torch::Tensor>> params, OptimConfig cfg);

  // One update with learning rate lr from the parameters' .grad (fp32). Parameters
  // without a grad are skipped.
  void step(double lr);
  int64_t steps() const { return steps_; }

  // State for checkpoints: "<name>.exp_avg", "<name>.exp_avg_sq" (fp32, parameter
  // device) and the step count.
  std::vector<std::pair<std::string, torch::Tensor>> state() const;
  void set_steps(int64_t n) { steps_ = n; }
  // Copies a state tensor in place; throws kf::Error naming the tensor if unknown or of
  // the wrong shape.
  void load_state_tensor(const std::string& name, const torch::Tensor& value);

  const std::vector<std::pair<std::string, torch::Tensor>>& params() const { return params_; }

 private:
  std::vector<std::pair<std::string, torch::Tensor>> params_;
  std::vector<torch::Tensor> exp_avg_, exp_avg_sq_;
  OptimConfig cfg_;
  int64_t steps_ = 0;
};

// Global L2 norm of the gradients; if max_norm > 0 and the norm exceeds it, scales every
// gradient by max_norm / (norm + 1e-6) (torch's clip_grad_norm_). Returns the norm before.
double clip_grad_norm(const std::vector<torch::Tensor>& params, double max_norm);

}  // namespace kf::learner
