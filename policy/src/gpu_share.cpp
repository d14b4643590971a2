// GpuShare (kf/policy/policy.h): the evaluator holds a GPU's GpuTimingLock exclusively around
// each timed trial; a learner's or actor's GPU work runs inside enter()/leave(), which hold it
// shared, and leave() synchronizes the device first, so none of their kernels still runs when
// a trial starts (docs/architecture.md#sharing-a-gpu). Holds are short (a decode chunk, a
// micro-batch), so a trial waits little. The lock is per open file description: one thread
// per GpuShare.
#include "kf/policy/policy.h"

#include <chrono>
#include <torch/cuda.h>

#include "kf/common/log.h"

#ifdef KF_POLICY_CUDA
#include <cuda_runtime.h>
#endif

namespace kf::policy {

std::string cuda_gpu_lock_key(int index) {
#ifdef KF_POLICY_CUDA
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, index) == cudaSuccess)
    return gpu_lock_key_pci(prop.pciDomainID, prop.pciBusID, prop.pciDeviceID);
  cudaGetLastError();
#endif
  return std::to_string(index);
}

GpuShare::GpuShare(torch::Device device, const std::string& lock_dir) : device_(device) {
  if (!device.is_cuda()) return;
  key_ = cuda_gpu_lock_key(device.has_index() ? device.index() : 0);
  lock_ = std::make_unique<GpuTimingLock>(lock_dir, key_);
}

void GpuShare::enter() {
  if (!lock_ || lock_->held()) return;
  const auto t0 = std::chrono::steady_clock::now();
  // One hour: a trial lasts milliseconds; only a wedged evaluator takes longer.
  if (!lock_->lock_shared())
    log_warn("gpu share: no shared hold of GPU ", key_, " (", lock_->path(),
             ") within an hour; going on without it, timings of this GPU may be disturbed");
  wait_s_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

void GpuShare::leave() {
  if (!lock_ || !lock_->held()) return;
  // Drain our queued kernels before the evaluator may start timing.
  torch::cuda::synchronize(device_.has_index() ? device_.index() : -1);
  lock_->unlock();
}

void GpuShare::pause_point() {
  if (!lock_) return;
  leave();
  enter();
}

GpuShare::Scope::~Scope() {
  if (!s_) return;
  try {
    s_->leave();
  } catch (const std::exception& e) {
    // A failed device sync (the GPU is in error) must not escape a destructor; the lock
    // file is released when the process exits at the latest.
    log_warn("gpu share: leaving the shared GPU hold failed: ", e.what());
  }
}

}  // namespace kf::policy
