// GpuMemoryBudget: GPU memory claims that every evaluator on one physical GPU shares, so
// several evaluators (launch.evaluators, or runs side by side) do not run each other out
// of memory. Verifying one candidate of a GPU-sized task holds tens of GiB (inputs,
// reference outputs, the sandbox worker's copies); without claims, three evaluators per
// run on one H200 scored most candidates "out of GPU memory"
// (docs/results/2026-12-03-h200-focus-runs.md).
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

// What verifying one candidate holds on the GPU, from the task's tensor sizes: 2 in +
// 4 out + 3 GiB. Measured on the H200 (bench/evaluator/peak_memory.sh; the
// allocator peak plus the sandbox's device arena, Result::gpu_peak_gb), the peaks fit
// 1.4 in + 3.4 out + 2.75 GiB: 21.75 GiB with 4 GiB inputs and outputs (003, 004, 011,
// 001_relu), 12.25 with 2 GiB (010), 8.25 with a 4 GiB input and a small output (016);
// a failing kernel, asked again with other poison and other inputs, peaked lower (17.75).
// The formula leaves about a quarter above those for tasks with more temporaries in the
// reference, and lets three 4 GiB verifications share the 0.7 budget of an H200 (3 x 27
// of 98 GiB). A verifier that copied the candidate's outputs out of the
// sandbox's slot and kept whole copies of set 0's, the previous set's and the current
// set's (and the previous set's reference outputs): 41.78 GiB on the same tasks, against
// 4 in + 8 out + 1 GiB (49). EvaluatorServiceTest's GPU test checks peak <= claim.
std::size_t verify_gpu_bytes(std::size_t input_bytes, std::size_t output_bytes);

}  // namespace kf
