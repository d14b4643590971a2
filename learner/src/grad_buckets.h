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
//
// Sharded mode (learner.dist.shard: optimizer): every bucket is padded to a multiple of
// world * 64 elements and split into world equal slices; rank r owns slice r of every
// bucket (its "shard": 1/world of the padded flat parameter buffer). Buckets are
// reduce-scattered instead of all-reduced, so after finish() only the owned slices hold
// the summed gradient. The parameters themselves are rebound (set_data) to views into
// flat parameter buckets of the same layout, so AdamW updates the owned slice in place
// and one in-place all-gather per bucket gives every rank the whole model.
//
// Sharded gradients (learner.dist.shard: gradients, ZeRO-2): no rank keeps a full
// gradient. Each rank has an fp32 accumulator for its slices only; a parameter's .grad is
// copied into its bucket's staging buffer by the hook and freed at once; a complete
// bucket is reduce-scattered and its owned slice added to the accumulator, then the
// staging buffer is freed (with NCCL, at most 3 reductions stay in flight). So every
// micro-batch is reduced, in "rounds": a rank opens a round (a one-number all-reduce,
// "is anyone still computing") when the first gradient of a backward arrives, and
// finish() keeps answering "done" and joining the others' rounds with zero buffers until
// every rank is done. Ranks with fewer micro-batches therefore issue the same collectives
// in the same order as the others. A round's buckets that did not complete (a parameter
// unused in that backward) are launched when the next backward starts or at finish().
// So no other collective may run between the first backward of a step and finish().
//
// Sharded parameters (learner.dist.shard: params, ZeRO-3): sharded gradients as above, and
// between uses a rank keeps only its slice of every parameter bucket (a tensor of its own,
// shard_numel(b) elements). Buckets follow `groups` (one per decoder layer, say): a new
// bucket starts wherever the group changes, whatever bucket_bytes says. The flat
// parameter buffer of a bucket keeps its shape, and the parameters stay views into it,
// but its storage is freed (0 bytes) while released; gather(b) allocates it again, copies
// the slice in and all-gathers (async with NCCL; wait_gathered(b) makes the caller's stream
// wait for that gather only), release(b) frees it. A bucket is released as soon as its reduce-scatter is
// launched (its gradients are in, so backward is done with its weights). AdamW updates the
// owned slices only; nothing is all-gathered after the step. Collective: gather() (every
// rank gathers the same buckets in the same order).
// Threading: the learner thread, plus the autograd thread inside backward().
#pragma once
#include <torch/torch.h>

#include <atomic>
#include <memory>
#include <cstdint>
#include <string>
#include <vector>

#include "kf/learner/learner.h"

namespace kf::policy {
class ParamHooks;
}

namespace kf::learner {

class GradBuckets {
 public:
  // params: (name, tensor) of the trainable parameters, all on one device, fp32 (sharded:
  // any one floating dtype; gradients then have that dtype too).
  // groups (params mode: required, one per parameter): parameters with the same group
  // value and adjacent in the list share a bucket.
  GradBuckets(const std::vector<std::pair<std::string, torch::Tensor>>& params, std::size_t bucket_bytes,
              Communicator* comm, ShardMode mode, const std::vector<int64_t>& groups = {});
  GradBuckets(const std::vector<std::pair<std::string, torch::Tensor>>& params, std::size_t bucket_bytes,
              Communicator* comm, bool sharded = false)
      : GradBuckets(params, bucket_bytes, comm, sharded ? ShardMode::optimizer : ShardMode::none) {}
  ~GradBuckets();
  GradBuckets(const GradBuckets&) = delete;
  GradBuckets& operator=(const GradBuckets&) = delete;

  void zero();    // zeroes every bucket (grads stay views) or gradient accumulator
  void arm();     // the next backward launches buckets as they complete (sharded gradients: always)
  void finish();  // launches the rest, waits; disarms
  std::size_t buckets() const { return bucket_len_.size(); }
  int64_t launched_in_backward() const { return launched_in_backward_; }  // last finish()
  const std::vector<torch::Tensor>& flat() const { return flat_; }        // empty with sharded gradients

  // Sharded layout (sharded() only).
  bool sharded() const { return sharded_; }
  bool grads_sharded() const { return grads_sharded_; }
  Communicator* comm() const { return comm_; }
  int64_t bucket_numel(std::size_t b) const { return bucket_len_[b]; }  // padding included
  int64_t shard_numel(std::size_t b) const { return bucket_len_[b] / world_; }
  int64_t shard_offset(std::size_t b) const { return rank_ * shard_numel(b); }  // in bucket b
  // The summed gradient of this rank's slice of bucket b (after finish()): a view into
  // the bucket, or (sharded gradients) the fp32 accumulator.
  torch::Tensor grad_shard(std::size_t b) const {
    return grads_sharded_ ? acc_[b] : flat_[b].narrow(0, shard_offset(b), shard_numel(b));
  }
  int64_t gradient_bytes() const;  // gradient memory this rank keeps between steps
  torch::Tensor param_flat(std::size_t b) const { return param_flat_[b]; }
  // This rank's slice of parameter bucket b: a view into the whole bucket, or (sharded
  // parameters) the slice this rank keeps.
  torch::Tensor param_shard(std::size_t b) const {
    return params_sharded_ ? pshard_[b] : param_flat_[b].narrow(0, shard_offset(b), shard_numel(b));
  }

  // Sharded parameters (params_sharded() only; gather/release are no-ops otherwise).
  bool params_sharded() const { return params_sharded_; }
  void gather(int64_t b);         // whole bucket b's weights (async with NCCL; no-op if gathered)
  void wait_gathered(int64_t b);  // the caller's stream waits for bucket b's gather (issued before)
  void release(int64_t b);        // frees bucket b's whole weights (no-op if released)
  bool gathered(int64_t b) const { return params_sharded_ ? gathered_[b] != 0 : true; }
  void gather_all();  // every bucket, waited for (snapshots, checkpoints, checksums)
  void release_all();
  // After changing gathered weights in place (loading a checkpoint): this rank's slices
  // take the gathered values. Every bucket must be gathered.
  void store_shards();
  // Bytes of parameter storage this rank holds now in the bucket buffers and its slices,
  // read from the tensors' storage.
  int64_t param_storage_bytes() const;
  // Where parameter i lives: its bucket and element offset in that bucket.
  int64_t bucket_of(int64_t param) const { return bucket_of_[param]; }
  int64_t offset_in_bucket(int64_t param) const { return offset_of_[param]; }
  const std::vector<torch::Tensor>& params() const { return params_; }
  int64_t padded_numel() const;  // sum of bucket sizes, padding included

  // Called by the hooks.
  void on_grad_ready(int64_t param);

 private:
  void launch_ready_in_order(bool in_backward);
  // Sharded gradients.
  void stage(int64_t param);
  void launch(int64_t b);
  void drain();                   // waits for launched reductions, adds them to acc_
  bool open_round(bool working);  // false: every rank is done (no round opened)
  void flush_round();             // launches the round's remaining buckets, closes it
  std::vector<torch::Tensor> flat_;
  std::vector<int64_t> bucket_len_;  // padded elements per bucket
  std::vector<torch::Tensor> acc_, staging_;
  std::vector<int64_t> in_flight_;  // buckets reduced, not yet added to acc_
  std::vector<char> seen_;          // per parameter: staged in the open round
  bool round_open_ = false;
  std::vector<torch::Tensor> param_flat_;           // sharded: parameter storage, same layout
  std::vector<torch::Tensor> pshard_;               // sharded parameters: this rank's slices
  std::vector<char> gathered_;                      // sharded parameters: bucket's storage allocated
  std::vector<std::shared_ptr<void>> gather_mark_;  // sharded parameters: Communicator::mark() after the gather
  std::vector<int64_t> bucket_of_;                  // per parameter
  std::vector<int64_t> offset_of_;                  // per parameter: element offset in its bucket
  std::vector<int64_t> bucket_size_;                // parameters per bucket
  std::vector<int64_t> pending_;
  std::vector<torch::Tensor> params_;
  Communicator* comm_;
  bool sharded_ = false, grads_sharded_ = false, params_sharded_ = false;
  int64_t rank_ = 0, world_ = 1;
  bool armed_ = false;
  int64_t next_launch_ = 0;
  int64_t launched_in_backward_ = 0;
};

// Sharded parameters: the bucket group of each parameter (HF names): its decoder layer
// ("model.layers.N."), -1 for the final norm and lm_head (their gradients come first in
// backward), -2 for the embeddings (last).
std::vector<int64_t> layer_groups(const std::vector<std::pair<std::string, torch::Tensor>>& params);

// The model's ParamHooks (policy::CausalLM::set_param_hooks) over buckets built in params
// mode with `groups` (layer_groups): forward gathers a layer, waits for it and starts the
// next layer's gather before the layer computes, then frees it; backward does the same
// downwards (with NCCL each gather runs on the communicator's stream while the layer
// before computes). The head's and the embeddings' buckets are gathered at the start of
// forward; the buckets free each bucket again once its gradients are reduce-scattered.
// Throws kf::Error when a layer has no trainable parameter. `buckets` must outlive it.
std::unique_ptr<policy::ParamHooks> layer_gathers(GradBuckets& buckets, const std::vector<int64_t>& groups,
                                                  int64_t layers);

}  // namespace kf::learner
