// The verified evaluator: compile a candidate, run it in a sandbox worker against the
// task's reference, and return a verdict, times, errors, checks and a reward.
//
//   kf::evaluator::Evaluator ev(opts);
//   Result r = ev.evaluate(*task, kf::tasks::Backend::CPU, source, /*candidate_seed=*/id);
//
// What it proves for an ok verdict (docs/evaluator.md has the full protocol):
//   the kernel writes every output element, leaves its inputs alone, matches the
//   reference within the dtype's tolerance on K fresh input sets from the task's
//   distribution, on global and local stress sets, with re-drawn parameters, on
//   near-duplicates of earlier inputs and parameters, before and after the reference,
//   and on every timed call; these calls come in an order drawn per candidate, checks
//   before, among and after the timed trials, each call alike from inside; its results
//   follow its inputs (no caching, no constants), do not depend on call order, and no
//   work escapes the timed region (threads, deferred writes, background GPU work). The
//   speedup is a ratio of medians of interleaved trials on fresh inputs, each bracketed
//   by device-wide synchronisation, with caches flushed, and comes with a 95 % interval.
//
// Threading: an Evaluator may be used by one thread at a time for evaluate() (it owns
// the device's timing); its CompileService may be used from any thread meanwhile.
#pragma once
#include <cstdint>
#include <memory>
#include <string>

#include "kf/common/config.h"
#include "kf/common/gpu_memory.h"
#include "kf/evaluator/compile.h"
#include "kf/evaluator/result.h"
#include "kf/evaluator/reward.h"
#include "kf/evaluator/sandbox.h"
#include "kf/tasks/tasks.h"

namespace kf::evaluator {

// The kernel ABI's backend code (compile service, sandbox) for a task backend.
inline kf::Backend abi_backend(tasks::Backend b) {
  return b == tasks::Backend::CUDA ? KF_BACKEND_CUDA : KF_BACKEND_CPU;
}

struct EvalOptions {
  CompileOptions compile;
  SandboxOptions sandbox;  // backend/device are set per evaluation
  RewardOptions reward;
  uint64_t seed = 0;    // run seed; input seeds derive from (seed, candidate seed)
  int device = 0;       // CUDA device of reference and worker
  int cpu_threads = 0;  // threads for the reference and the kernel (0: hardware)

  // correctness
  int correctness_sets = 3;  // K fresh sets from the task's distribution
  // Global stress sets (every element changed alike): x*8, then others drawn per candidate
  // from -x, x+3, uniform(-4,4), x*1e-3.
  int stress_sets = 2;
  // Local stress: one set with one large value per row, one with a handful of large
  // values scattered in the tensor (magnitudes tried from large to smaller until the
  // reference stays finite). A kernel that probes a few hundred elements cannot see them.
  bool local_stress = true;
  // A near-duplicate of the call before (a few elements in a few rows changed): the output
  // must follow (a cache keyed on a sparse fingerprint of the inputs returns stale rows).
  bool near_duplicate = true;
  // Re-drawn parameters (all of them around their init), and a near-duplicate of the
  // parameters (a few elements re-drawn, the rest as before).
  bool redraw_params = true;
  double stress_atol_scale_cap = 64;  // stress atol grows with output magnitude, up to this

  // timing
  int warmup = 2;
  int trials = 10;
  // More trials while the spread is too wide; still too wide after max_trials: the verdict
  // stays ok, flagged timing_unstable, with the conservative speedup (the interval's low end).
  int max_trials = 30;
  double max_spread = 0.5;  // (p90 - p10) / median, for reference and candidate
  bool flush_cache = true;
  // CUDA: each timed trial holds the run's exclusive GPU timing lock (kf/common/gpu_lock.h),
  // so learners and actors sharing the GPU pause meanwhile. Empty dir: $KF_GPU_LOCK_DIR or /tmp.
  bool gpu_lock = true;
  std::string gpu_lock_dir;
  double gpu_lock_timeout_s = 120;  // longer: an installation problem (kf::Error), not the kernel's
  // CUDA: verifying a candidate first claims its GPU memory (kf/common/gpu_memory.h) from a
  // budget of this fraction of the GPU's memory, shared by every evaluator on that GPU;
  // claims that do not fit wait (at most gpu_lock_timeout_s, then it goes ahead with a log
  // line). 0: no claims.
  double gpu_memory_fraction = 0.7;
  unsigned long long flush_bytes = 0;  // 0: CPU 2x LLC (<= 256 MiB), CUDA 256 MiB

  // limits and anti-cheat thresholds
  double min_call_timeout_s = 10;   // per kernel call, wall clock
  double call_timeout_factor = 50;  // x reference median
  double probe_ms = 5;              // quiet window after return (after a 1 ms settle), then outputs re-read
  double late_cpu_ms = 2.0;         // CPU other threads may use in the probe window
  double idle_cpu_ms = 2.0;         // CPU other threads may use between calls
  double presync_ms = 1.0;          // CUDA: a device sync before the clock may take this long
  double resume_ms = 2.0;           // reported: timed calls whose start mark came later than this after the resume
  double outside_cpu_ms = 0.2;      // CPU threads other than the worker's main one may use outside the call
                                    // (or a quarter of the call's time, whichever is more)
  double gpu_settle_ms = 0.5;       // CUDA: device busy after the worker stopped at return
  // Worker clock vs evaluator clock: when even the smallest gap over the timed calls is
  // larger than this (absolute, or relative to the median, whichever is larger), the
  // candidate is timed by the evaluator's clock between its start and end marks.
  double timer_slack_ms = 0.5;
  double timer_slack_frac = 0.25;
  double degenerate_rel = 1e-6;  // reference output spread below this x scale: degenerate
};

// From the run's config (run.seed and the evaluator.* keys); throws kf::Error naming the
// file and key for an out-of-range value.
EvalOptions eval_options(const Config& cfg);

class Evaluator {
 public:
  explicit Evaluator(EvalOptions opts);
  ~Evaluator();
  Evaluator(const Evaluator&) = delete;
  Evaluator& operator=(const Evaluator&) = delete;

  // Compiles and verifies. Never throws for anything the candidate does; throws kf::Error
  // for problems of the task or the installation (missing worker, unusable task).
  Result evaluate(const tasks::Task& task, tasks::Backend backend, const std::string& source,
                  uint64_t candidate_seed = 0);
  // Verifies an already compiled shared object (compile_s taken from `compiled`).
  Result evaluate_compiled(const tasks::Task& task, tasks::Backend backend, const CompileResult& compiled,
                           uint64_t candidate_seed = 0);

  CompileService& compiler();
  RewardModel& reward_model();
  const EvalOptions& options() const;

 private:
  // Claims the GPU memory of verifying one candidate of `task` (null: no claim was had).
  GpuMemoryBudget* claim_gpu_memory(const tasks::Task& task, const EvalOptions& o);
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kf::evaluator
