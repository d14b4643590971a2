// GpuMemoryBudget: GPU memory claims that every evaluator on one physical GPU shares, so
// several evaluators (launch.evaluators, or runs side by side) do not run each other out
// of memory. Verifying one candidate of a GPU-sized task holds tens of GiB (inputs,
// reference outputs, the sandbox worker's copies); without claims, three evaluators per
// run on one H200 scored most candidates "out of GPU memory" (docs/operations.md).
//
// A claim is a line "pid start_time bytes" in a table file next to the GPU timing lock
// (kf-gpu<key>.mem), read and rewritten under flock(2). A claim is granted when it fits
// next to the live claims, or when there is no other claim (a task bigger than the budget
// still runs, alone). Claims of processes that died (pid gone, zombie, or reused with
// another start time) are dropped by the next reader, so a SIGKILLed evaluator frees its
// claim. Not for timing: the timing lock (gpu_lock.h) still serialises timed trials.
//
// Threading: one object per process, used from one thread; one claim at a time.
#pragma once
#include <chrono>
#include <cstddef>
#include <string>

namespace kf {

class GpuMemoryBudget {
 public:
  // `dir` and `gpu` as for GpuTimingLock (same file folder, same key). Throws kf::Error
  // naming the file when it cannot be opened.
  GpuMemoryBudget(const std::string& dir, const std::string& gpu, std::size_t budget_bytes);
  ~GpuMemoryBudget();
  GpuMemoryBudget(const GpuMemoryBudget&) = delete;
  GpuMemoryBudget& operator=(const GpuMemoryBudget&) = delete;

  // Waits (polling every 20 ms) until `bytes` fit; false if `timeout` passed first (then
  // nothing is claimed). A second claim by the same object replaces the first.
  bool claim(std::size_t bytes, std::chrono::milliseconds timeout);
  void release();
  // Bytes claimed by other live processes now (metrics, tests).
  std::size_t claimed_by_others();
  std::size_t budget() const { return budget_; }
  std::size_t held() const { return held_; }  // this object's claim (0: none)
  const std::string& path() const { return path_; }

 private:
  bool try_claim(std::size_t bytes);
  std::string path_;
  int fd_ = -1;
  std::size_t budget_ = 0, held_ = 0;
};

// What verifying one candidate holds on the GPU, from the task's tensor sizes: 4 in +
// 8 out + 1 GiB. Measured (stop 18, H200, 4 GiB inputs and outputs): the evaluator's peak
// (allocator plus the sandbox's device arena, Result::gpu_peak_gb) was 57.25 GiB against
// this 49 GiB, with the worker at 0.8 GiB. Keeping the cached-results check's last three
// reference outputs as samples did not lower it (57.25 again); the output checks'
// whole-tensor temporaries (a double copy of a float output and its masks: about 6 x
// output) are now made chunk by chunk, which is counted to leave about 35 GiB.
// EvaluatorServiceTest's GPU test checks peak <= claim: it passed on the H200 in stop 19.
std::size_t verify_gpu_bytes(std::size_t input_bytes, std::size_t output_bytes);

}  // namespace kf
