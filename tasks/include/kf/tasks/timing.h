// Timing of reference forwards, shared by tools and benchmarks so every number the
// project prints about a reference comes from one protocol:
//   warm-up calls, then per trial: device-wide sync, clock, forward, device-wide sync, clock.
// The device-wide sync means work on any stream is counted.
#pragma once
#include <ATen/core/Tensor.h>

#include <vector>

#include "kf/tasks/task.h"

namespace kf::tasks {

void synchronize(const at::Device& device);  // cudaDeviceSynchronize for CUDA; no-op on CPU

struct TimingStats {
  std::vector<double> trials_ms;
  double median_ms = 0, p10_ms = 0, p90_ms = 0, min_ms = 0;
};
TimingStats summarize_ms(std::vector<double> trials_ms);

// Times `ref` on `inputs` (already on `device`).
TimingStats time_reference(Reference& ref, const std::vector<at::Tensor>& inputs, const at::Device& device, int warmup,
                           int trials);

// The device a backend runs on in this process ("cuda" uses CUDA device `index`).
// Throws kf::Error if the backend is cuda and no GPU is visible.
at::Device backend_device(Backend b, int index = 0);
bool cuda_available();
// Returns the GPU memory the caching allocator holds but does not use to the driver, so
// other processes on the GPU can have it (after an out-of-memory error). No-op without a GPU.
void release_device_cache();
// Bytes the caching allocator holds on the current CUDA device (in use or cached); 0
// without a GPU. Several evaluators share one GPU: each frees its cache above a limit.
std::size_t device_cache_reserved_bytes();
// The most it held since the last reset_device_cache_peak() (the evaluator's per-verification
// peak, set against its GPU memory claim); 0 / no-op without a GPU.
std::size_t device_cache_peak_reserved_bytes();
void reset_device_cache_peak();

}  // namespace kf::tasks
