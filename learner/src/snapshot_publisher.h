// Publishing policy weights to the run's SnapshotStore for the actors, without stalling
// training for long (the Learner's rank 0 owns one; tests and benchmarks use it directly).
//
// Blob format: a safetensors image in memory (u64 header length, JSON header with HF
// parameter names, dtype and offsets, then the data), so a reader needs nothing but
// kf::policy::st_parse; metadata carries "kf_version" (the policy version).
// A model with LoRA adapters publishes only the adapter tensors (megabytes, not the
// gigabytes of the frozen base), with metadata kf_lora_rank, kf_lora_alpha and
// kf_lora_targets (comma-separated): readers add the same adapters to their own copy of
// the base and apply them unmerged. The actors' reader is actors/src/weights_blob.h.
//
// publish(version): the learner thread only snapshots the weights: on CUDA a
// device-to-device cast into a staging buffer (the model may change right after), on
// CPU a cast-copy into the host blob. A background thread then copies device ->
// pinned host (own stream) and writes the store. A publish due while the previous one
// is still in flight first waits for it; that wait counts as stall.
// Threading: publish/wait/stats from the learner thread.
#pragma once
#include <torch/torch.h>

#include <cstdint>
#include <exception>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "kf/learner/learner.h"
#include "kf/policy/policy.h"
#include "kf/replay/replay.h"

namespace kf::learner {

class SnapshotPublisher {
 public:
  // dtype: kBFloat16 or kFloat32. `store` may be null (then only the blob is built,
  // e.g. for benchmarks); it must outlive the publisher.
  SnapshotPublisher(policy::CausalLM model, replay::SnapshotStore* store, torch::ScalarType dtype);
  ~SnapshotPublisher();
  SnapshotPublisher(const SnapshotPublisher&) = delete;
  SnapshotPublisher& operator=(const SnapshotPublisher&) = delete;

  void publish(int64_t version);
  void wait();  // until the background part of the last publish is done; rethrows its error
  PublishStats stats() const { return stats_; }
  uint64_t blob_bytes() const { return blob_bytes_; }
  // The host blob of the last finished publish (valid after wait()).
  const unsigned char* blob() const { return host_.data_ptr<unsigned char>(); }

 private:
  struct Slot {
    std::string name;
    torch::Tensor param, staging, host_view;
  };
  void background(int64_t version, double stall_ms, double t0);
  policy::CausalLM model_;
  replay::SnapshotStore* store_;
  torch::ScalarType dtype_;
  bool cuda_;
  torch::Tensor host_;  // uint8 blob (pinned on CUDA)
  uint64_t blob_bytes_ = 0;
  std::vector<Slot> slots_;
  std::thread worker_;
  std::exception_ptr error_;
  std::shared_ptr<void> ready_event_;  // at::cuda::CUDAEvent on CUDA builds
  PublishStats stats_;
};

// The blob metadata of a LoRA configuration (kf_lora_rank, kf_lora_alpha, kf_lora_targets).
std::map<std::string, std::string> lora_metadata(const policy::LoraConfig& c);

// Reader side: copies a blob published above into `model`'s parameters by name (any
// dtype conversion in the copy). Throws kf::Error naming `context` and the tensor on a
// missing or extra tensor or a shape mismatch. An adapter-only blob needs a model with
// the same adapters and fills only them. Returns the blob's kf_version (-1 if absent).
int64_t load_weights_blob(policy::CausalLM& model, const void* data, std::size_t bytes, const std::string& context);

}  // namespace kf::learner
