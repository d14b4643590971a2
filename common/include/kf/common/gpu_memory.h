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

// What verifying one candidate holds on the GPU, from the task's tensor sizes: 3 in +
// 5 out + 2 GiB. Counted from verify.cpp (stop 20): the sandbox's device arena (1 in +
// 1 out), and at most 2 in + 3 out of the evaluator's tensors at once (a failing set:
// its inputs, the reference's outputs and set 0's, then other inputs and their reference
// outputs while the candidate is asked again), plus the reference's own temporaries
// (about 1 out) and the output checks' chunks and the cache flush buffer (the 2 GiB).
// Before stop 20 the verifier kept whole copies of the candidate's outputs (set 0's, the
// previous set's, the current one's) and the previous set's reference outputs: measured
// on the H200 in stop 20 with 4 GiB inputs and outputs, a 41.78 GiB peak (allocator peak
// plus arena, Result::gpu_peak_gb) against the 49 GiB of the formula then (4 in + 8 out
// + 1 GiB); those are samples now. bench/evaluator/peak_memory.sh measures the peak per
// task against this claim; EvaluatorServiceTest's GPU test checks peak <= claim.
std::size_t verify_gpu_bytes(std::size_t input_bytes, std::size_t output_bytes);

}  // namespace kf
