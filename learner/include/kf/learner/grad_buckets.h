// GradBuckets: every trainable parameter's .grad is a view into one of a few flat fp32
// buckets (DDP's gradient_as_bucket_view), so the all-reduce moves whole buckets with
// no copies, and autograd accumulates micro-batches into them in place.
//
// Overlap: while armed (the last micro-batch of a step), a post-accumulate-grad hook on
// each parameter counts down its bucket; a bucket whose parameters all have their
// gradient is handed to Communicator::all_reduce_async at once, strictly in bucket
// order (every rank must issue the same collectives in the same order). Buckets are
// filled in reverse parameter order, roughly the order backward produces them. With
// NCCL the reductions run on the communicator's stream while backward continues; with
// the shm communicator they run inline on the autograd thread. finish() reduces any
// bucket not yet launched (a rank with no data, unused parameters) and synchronises.
// Threading: the learner thread, plus the autograd thread inside backward().
#pragma once
#include <torch/torch.h>

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "kf/learner/comm.h"

namespace kf::learner {

class GradBuckets {
 public:
  // params: (name, tensor) of the trainable parameters, all on one device, fp32.
  GradBuckets(const std::vector<std::pair<std::string, torch::Tensor>>& params, std::size_t bucket_bytes,
              Communicator* comm);
  ~GradBuckets();
  GradBuckets(const GradBuckets&) = delete;
  GradBuckets& operator=(const GradBuckets&) = delete;

  void zero();            // zeroes every bucket (grads stay views)
  void arm();             // the next backward launches buckets as they complete
  void finish();          // launches the rest, waits; disarms
  std::size_t buckets() const { return flat_.size(); }
  int64_t launched_in_backward() const { return launched_in_backward_; }  // last finish()
  const std::vector<torch::Tensor>& flat() const { return flat_; }

  // Called by the hooks.
  void on_grad_ready(int64_t param);

 private:
  void launch_ready_in_order(bool in_backward);
  std::vector<torch::Tensor> flat_;
  std::vector<int64_t> bucket_of_;     // per parameter
  std::vector<int64_t> bucket_size_;   // parameters per bucket
  std::vector<int64_t> pending_;
  std::vector<torch::Tensor> params_;
  Communicator* comm_;
  bool armed_ = false;
  int64_t next_launch_ = 0;
  int64_t launched_in_backward_ = 0;
};

}  // namespace kf::learner
