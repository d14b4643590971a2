#include "kf/tasks/tasks.h"

#include <ATen/Context.h>
#include <ATen/DeviceAccelerator.h>
#include <ATen/detail/CUDAHooksInterface.h>

#include <algorithm>
#include <chrono>

namespace kf::tasks {

void release_device_cache() {
  if (cuda_available()) at::accelerator::emptyCache();
}

namespace {
c10::CachingAllocator::Stat reserved_stat() {
  const auto stats = at::accelerator::getDeviceStats(at::accelerator::getDeviceIndex());
  return stats.reserved_bytes[static_cast<std::size_t>(c10::CachingAllocator::StatType::AGGREGATE)];
}
}  // namespace

std::size_t device_cache_reserved_bytes() {
  return cuda_available() ? static_cast<std::size_t>(reserved_stat().current) : 0;
}

// The peak is a diagnosis: it must never fail a verification. The allocator's stats exist
// only once CUDA is initialised in this process (a fresh evaluator has not yet).
std::size_t device_cache_peak_reserved_bytes() {
  if (!cuda_available()) return 0;
  try {
    at::globalContext().lazyInitDevice(at::kCUDA);
    return static_cast<std::size_t>(reserved_stat().peak);
  } catch (const c10::Error&) {
    return 0;
  }
}

void reset_device_cache_peak() {
  if (!cuda_available()) return;
  try {
    at::globalContext().lazyInitDevice(at::kCUDA);
    at::accelerator::resetPeakStats(at::accelerator::getDeviceIndex());
  } catch (const c10::Error&) {
  }
}

bool cuda_available() { return at::detail::getCUDAHooks().hasCUDA() && at::detail::getCUDAHooks().deviceCount() > 0; }

at::Device backend_device(Backend b, int index) {
  if (b == Backend::CPU) return at::Device(at::kCPU);
  if (!cuda_available()) throw Error("backend cuda asked for, but no CUDA device is visible");
  return at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(index));
}

void synchronize(const at::Device& device) {
  if (device.is_cuda()) at::detail::getCUDAHooks().deviceSynchronize(device.index());
}

TimingStats summarize_ms(std::vector<double> v) {
  TimingStats s;
  s.trials_ms = v;
  if (v.empty()) return s;
  std::sort(v.begin(), v.end());
  auto q = [&](double p) { return v[static_cast<std::size_t>(p * (v.size() - 1) + 0.5)]; };
  s.min_ms = v.front();
  s.p10_ms = q(0.1);
  s.p90_ms = q(0.9);
  s.median_ms = v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
  return s;
}

TimingStats time_reference(Reference& ref, const std::vector<at::Tensor>& inputs, const at::Device& device, int warmup,
                           int trials) {
  for (int i = 0; i < warmup; ++i) ref.forward(inputs);
  synchronize(device);
  std::vector<double> ms;
  ms.reserve(trials);
  for (int i = 0; i < trials; ++i) {
    synchronize(device);
    auto t0 = std::chrono::steady_clock::now();
    auto out = ref.forward(inputs);
    synchronize(device);
    auto t1 = std::chrono::steady_clock::now();
    ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
  }
  return summarize_ms(std::move(ms));
}

}  // namespace kf::tasks
