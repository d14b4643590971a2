// GPU utilization for the live status, read through NVML opened at run time (see gpu_util.h).
#include "gpu_util.h"

#include <dlfcn.h>

namespace kf::launch {

namespace {
struct NvmlUtilization {  // nvmlUtilization_t
  unsigned int gpu, memory;
};
}  // namespace

GpuUtilization::GpuUtilization() {
  lib_ = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!lib_) return;
  auto init = reinterpret_cast<int (*)()>(dlsym(lib_, "nvmlInit_v2"));
  auto count = reinterpret_cast<int (*)(unsigned int*)>(dlsym(lib_, "nvmlDeviceGetCount_v2"));
  auto handle = reinterpret_cast<int (*)(unsigned int, void**)>(dlsym(lib_, "nvmlDeviceGetHandleByIndex_v2"));
  get_util_ = reinterpret_cast<int (*)(void*, void*)>(dlsym(lib_, "nvmlDeviceGetUtilizationRates"));
  unsigned int n = 0;
  if (!init || !count || !handle || !get_util_ || init() != 0 || count(&n) != 0) {
    dlclose(lib_);
    lib_ = nullptr;
    return;
  }
  for (unsigned int i = 0; i < n; ++i) {
    void* h = nullptr;
    if (handle(i, &h) == 0) handles_.push_back(h);
  }
}

GpuUtilization::~GpuUtilization() {
  if (!lib_) return;
  if (auto shutdown = reinterpret_cast<int (*)()>(dlsym(lib_, "nvmlShutdown"))) shutdown();
  dlclose(lib_);
}

double GpuUtilization::busy() {
  if (!lib_ || handles_.empty()) return -1;
  double sum = 0;
  int n = 0;
  for (void* h : handles_) {
    NvmlUtilization u{};
    if (get_util_(h, &u) == 0) sum += u.gpu / 100.0, ++n;
  }
  return n ? sum / n : -1;
}

}  // namespace kf::launch
