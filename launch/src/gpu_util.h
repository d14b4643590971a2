// GpuUtilization: the GPUs' busy fraction (NVML's utilization.gpu: the share of the last
// sample period in which a kernel ran), for the launcher's status line.
// NVML comes with the driver, not the toolkit, so it is opened with dlopen at run time:
// on a machine without a driver busy() returns -1 and nothing else changes.
// Threading: one thread.
#pragma once
#include <vector>

namespace kf::launch {

class GpuUtilization {
 public:
  GpuUtilization();
  ~GpuUtilization();
  GpuUtilization(const GpuUtilization&) = delete;
  GpuUtilization& operator=(const GpuUtilization&) = delete;
  bool available() const { return lib_ != nullptr; }
  int devices() const { return static_cast<int>(handles_.size()); }
  // Mean busy fraction (0..1) over every device; -1 if unknown.
  double busy();

 private:
  void* lib_ = nullptr;
  std::vector<void*> handles_;
  int (*get_util_)(void*, void*) = nullptr;
};

}  // namespace kf::launch
