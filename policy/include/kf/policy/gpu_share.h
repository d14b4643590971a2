// GpuShare: how a learner or an actor shares its GPU with the run's evaluator.
// The evaluator holds the GPU's GpuTimingLock exclusively around each timed trial. GPU work
// of the other processes runs inside enter()/leave(), which hold the lock shared, and
// leave() drains the device first, so none of their kernels is still running when a trial
// starts (ARCHITECTURE.md: "no other process of the run does GPU work on that GPU while
// it times"). Holds are short (a decode chunk, a micro-batch) so a trial waits little.
// On a CPU device every call is a no-op.
// Threading: one thread at a time per GpuShare (the lock is per open file description).
#pragma once
#include <memory>
#include <string>

#include <torch/types.h>

#include "kf/common/gpu_lock.h"

namespace kf::policy {

class GpuShare {
 public:
  GpuShare() = default;  // inactive
  // `lock_dir`: where the evaluator's lock files are (empty: $KF_GPU_LOCK_DIR or /tmp).
  // Throws kf::Error if the lock file cannot be opened.
  GpuShare(torch::Device device, const std::string& lock_dir = "");
  GpuShare(GpuShare&&) = default;
  GpuShare& operator=(GpuShare&&) = default;

  bool active() const { return lock_ != nullptr; }
  void enter();                                    // shared hold; blocks while a trial runs or waits for the GPU
  void leave();                                    // synchronize the device, then release (no-op when not held)
  void pause_point();                              // leave() then enter(): lets a waiting trial run between chunks
  double wait_seconds() const { return wait_s_; }  // total time spent waiting in enter()
  const std::string& key() const { return key_; }

  // RAII: enter() now, leave() at scope exit (also on exceptions). Null or inactive: no-op.
  class Scope {
   public:
    explicit Scope(GpuShare* s) : s_(s && s->active() ? s : nullptr) {
      if (s_) s_->enter();
    }
    ~Scope();
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    GpuShare* s_;
  };

 private:
  std::unique_ptr<GpuTimingLock> lock_;
  torch::Device device_{torch::kCPU};
  std::string key_;
  double wait_s_ = 0;
};

// The lock key of CUDA device `index` as this process numbers it (its PCI location,
// gpu_lock_key_pci); the ordinal as text in a build without CUDA.
std::string cuda_gpu_lock_key(int index);

}  // namespace kf::policy
