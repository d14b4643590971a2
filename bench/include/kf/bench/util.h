// Small helpers the torch benchmarks share: a monotonic clock, a device barrier between
// timed phases, and "64,128,256"-style list options.
#pragma once
#include <torch/torch.h>

#include <chrono>
#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

namespace kf::bench {

// Seconds on the steady clock.
inline double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Waits for the device's queued work (CUDA), so a phase's time is its own; CPU: nothing.
inline void sync(const torch::Device& d) {
  if (d.is_cuda()) torch::cuda::synchronize(d.has_index() ? d.index() : -1);
}

// "64,128,256" -> {64, 128, 256} (std::stoll's exceptions on a bad item).
inline std::vector<int64_t> parse_list(const std::string& s) {
  std::vector<int64_t> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) out.push_back(std::stoll(item));
  return out;
}

}  // namespace kf::bench
