// kf/evaluator/evaluator.h: the evaluator component's one public header. Sections:
//   torch-free (kf_evaluator_core; a file that must stay torch-free defines
//   KF_EVALUATOR_CORE_ONLY before including this header and sees this part only):
//     TimeSummary, paired_speedup_interval   timing statistics
//     CompileService                         the compile cache and pool
//     Result, Check, Verdict, Cause          the verdict on one candidate
//     RewardModel                            reward of a verified result
//     SandboxOptions, gpu_lock_key           the sandbox worker's settings
//   with torch (kf_evaluator):
//     EvalOptions, Evaluator                 the verified evaluator
//     evaluate_retrying_oom                  verification while the GPU is out of memory
// The kernel ABI that candidates compile against is kf/kernel.h, apart from this header.
//
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
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "kf/kernel.h"
#include "kf/replay/records.h"  // defines: Verdict, Cause, verdict_name, cause_name

namespace kf::evaluator {

// --- Timing statistics of the evaluator: robust summaries of repeated trials.
// Pure functions; any thread.

struct TimeSummary {
  int n = 0;
  double median = 0, p10 = 0, p90 = 0, min = 0, max = 0, mean = 0;
  // (p90 - p10) / median: the relative spread the give-up rule looks at.
  double spread() const { return median > 0 ? (p90 - p10) / median : 0; }
};

// Linear-interpolated quantile q in [0,1] of unsorted values (empty: 0).
double quantile(std::vector<double> v, double q);
TimeSummary summarize(const std::vector<double>& v);

// Speedup from paired trials: median over i of ref[i] / cand[i] would be noisy, so it
// is the ratio of medians (what is reported), see docs/evaluator.md.
double speedup_of(const TimeSummary& ref, const TimeSummary& cand);

// A distribution-free confidence interval for the speedup from paired trials: the
// per-trial ratios ref[i] / cand[i] (each pair ran side by side), and the order
// statistics that bracket their median with at least `confidence` (binomial, no
// normality assumed). mid is the ratio of medians (speedup_of). With too few pairs for
// the confidence asked, lo and hi are the smallest and largest ratio.
struct SpeedupInterval {
  double lo = 0, mid = 0, hi = 0;
};
SpeedupInterval paired_speedup_interval(const std::vector<double>& ref_ms, const std::vector<double>& cand_ms,
                                        double confidence = 0.95);

// --- Compile service: candidate source -> shared object, through a content-addressed cache
// and a TBB pool.
//
// The cache key is SHA-256 of (backend, compiler identity, flags, source), so a source
// compiles once per compiler and flag set; failures are cached too (a policy repeats
// itself). Each compile runs in its own process group with a wall-clock limit (the
// whole group is killed), an address-space limit, and bounded output; diagnostics come
// back truncated to the first errors. A compile error is a result, never an exception.
//
// The compiler runs confined (docs/evaluator.md, "Compile service"): as nobody, without
// network, in a private filesystem view holding only the toolchain and system headers
// (/usr), the ABI headers and the job's own folder. Files it opened (its dependency
// output) and files its diagnostics point into must be allowed headers, or the source is
// rejected naming the file. If the confinement cannot be set up the compile fails with
// the reason (and a log line); it never runs unconfined.
//
// Threading: one CompileService may be shared by any number of threads. Identical
// sources submitted concurrently compile once.

struct CompileOptions {
  std::string cache_dir;    // empty: $KF_EVAL_CACHE or /tmp/kf-eval-cache-<uid>
  std::string cxx = "g++";  // CPU backend compiler
  std::string nvcc = "/usr/local/cuda/bin/nvcc";
  std::string cuda_arch = "sm_90";  // -arch=
  std::vector<std::string> cxx_flags = {"-std=c++17", "-O3", "-march=native", "-fopenmp", "-shared", "-fPIC"};
  std::vector<std::string> cuda_flags = {"-std=c++17", "-O3", "-shared", "-Xcompiler", "-fPIC", "-lcublas"};
  std::string include_dir;                             // folder holding kf/kernel.h (empty: the built-in one)
  double time_limit_s = 60;                            // per compile, wall clock
  unsigned long long memory_limit_bytes = 4ull << 30;  // address space of the compiler
  std::size_t max_diagnostics_bytes = 4000;
  int max_errors = 5;            // first N "error" lines are kept first
  int jobs = 0;                  // parallel compiles (0: hardware threads)
  bool cpu_model_in_key = true;  // -march=native objects are CPU-specific
};

struct CompileResult {
  bool ok = false;
  std::string so_path;      // the shared object (ok only)
  std::string key;          // content address
  std::string diagnostics;  // truncated: first errors, then the head of the output
  bool cached = false;      // served from the cache (no compiler run)
  bool timed_out = false;
  bool rejected_source = false;      // refused by the include policy or the opened-file check
  bool environment_failure = false;  // the compiler did not run (confinement, service error): not the source's fault
  double seconds = 0;                // wall time of this call
};

class CompileService {
 public:
  explicit CompileService(CompileOptions opts);
  ~CompileService();
  CompileService(const CompileService&) = delete;
  CompileService& operator=(const CompileService&) = delete;

  // Blocking compile on the calling thread (still deduplicated and cached).
  CompileResult compile(const std::string& source, Backend backend);
  // Queued on the pool.
  std::shared_future<CompileResult> submit(const std::string& source, Backend backend);
  // All at once on the pool; results in input order.
  std::vector<CompileResult> compile_all(const std::vector<std::string>& sources, Backend backend);

  // The compiler's identity line (part of the cache key), e.g. "g++ (Debian 12.2.0-14) 12.2.0".
  std::string compiler_identity(Backend backend);
  const CompileOptions& options() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Source checks applied before compiling, a cheap first filter: #include of absolute paths
// or "..", #embed and .incbin are refused. Returns "" if fine. (Macros, digraphs and line
// splices get past any text filter; the compiler's confinement is what holds.)
std::string check_source_policy(const std::string& source);

// --- The evaluator's verdict on one candidate: plain data (no torch), with JSON and text
// renderings. The verdict and its cause are the record layer's own types (replay/
// records.h), so the shared-memory Result record carries them as they are.

using replay::Cause;
using replay::cause_name;
using replay::Verdict;
using replay::verdict_name;

// One named check and how it went, in the order the evaluator ran them.
struct Check {
  std::string name;  // e.g. "correct.distribution", "anti.timer_tamper"
  bool passed = true;
  std::string detail;
};

struct Result {
  std::string task, backend, candidate_key;
  Verdict verdict = Verdict::ok;
  Cause cause = Cause::kernel;  // environment: the machine caused the verdict (the learner leaves it out)
  std::string reason;           // empty when ok; names the trick for rejected_cheat
  std::string diagnostics;      // compiler errors or worker log tail (truncated)
  TimeSummary ref_ms, cand_ms;  // timed trials
  double speedup = 0;           // ref median / candidate median (ok only); speedup_lo when timing_unstable
  // The speedup's 95 % interval from the paired trials (stats.h: paired_speedup_interval).
  double speedup_lo = 0, speedup_hi = 0;
  // Correct, but its time could not be measured stably (spread over max_spread after
  // max_trials): still ok, and `speedup` is then the conservative estimate speedup_lo,
  // which the reward uses.
  bool timing_unstable = false;
  double max_abs_error = 0, max_rel_error = 0;  // over every checked call
  bool nondeterministic = false;  // identical calls gave different bits at the sampled positions (within tolerance)
  bool task_degenerate = false;   // reference output (nearly) constant / input-independent
  std::string degenerate_reason;
  std::vector<Check> checks;
  double reward = 0;
  double compile_s = 0, verify_s = 0;
  // CUDA: the GPU memory this verification claimed (0: no claim) and the most this process
  // held for it (caching allocator peak plus the sandbox's device arena); the worker's own
  // context and buffers are not in it. For fitting the claim's factors to what is used.
  double gpu_claim_gb = 0, gpu_peak_gb = 0;
  // Where verify_s went (CUDA, for the evaluators' throughput): waiting for the GPU memory
  // claim, waiting for the timing lock (exclusive and shared holds), and the timed trials
  // with their warm-ups, lock waits included; and how many timed trials ran.
  double claim_wait_s = 0, lock_wait_s = 0, timing_s = 0;
  int timed_trials = 0;
  bool ok() const { return verdict == Verdict::ok; }
  int checks_passed() const;
};

std::string to_json(const Result& r, int indent = -1);
std::string to_text(const Result& r);

// --- Reward of a verified result, for the learner.
//
// Default (kind "cuda_l1", after CUDA-L1): raw score = speedup; normalised with running
// statistics (mean, std) of the raw scores of the last `window` ok results, and clipped
// to [-clip, clip]. Until `min_samples` are seen, the score is clip(speedup - 1).
// Failure verdicts get fixed rewards, below -clip by default so that a slow correct
// kernel always beats a broken one.
// Other kinds: "speedup" (clip(speedup - 1)), "log_speedup" (clip(log speedup)).
//
// A result on a degenerate task (Result::task_degenerate: the reference output barely
// depends on the inputs, so a kernel that returns a constant can pass) earns no speed
// reward: it is scored as speedup 1.0 under the configured kind (0 for "speedup" and
// "log_speedup"; for "cuda_l1" the normalised score of 1.0, without adding the sample
// to the running statistics), whatever speedup it measured.
//
// Threading: RewardModel is thread-safe (one mutex).

struct RewardOptions {
  std::string kind = "cuda_l1";
  double clip = 2.0;
  int window = 1024;
  int min_samples = 16;
  double min_std = 0.05;
  double compile_error = -3.0, runtime_error = -3.0, timeout = -3.0, incorrect = -3.0, rejected_cheat = -4.0;
};

class RewardModel {
 public:
  explicit RewardModel(RewardOptions o = {});
  // Scores one result (and, for ok results, updates the running statistics).
  double score(Verdict v, double speedup);
  // As above, and a degenerate task's ok result gets neutral_reward().
  double score(const Result& r);
  // The reward of speedup 1.0 under the configured kind, without updating the statistics.
  double neutral_reward() const;
  double failure_reward(Verdict v) const;
  double running_mean() const;
  double running_std() const;
  int samples() const;

 private:
  RewardOptions o_;
  mutable std::mutex mu_;
  std::deque<double> recent_;
  double sum_ = 0, sum2_ = 0;
};

// --- Sandbox options: the sandbox worker process (kf-sandbox-worker) that loads one
// untrusted candidate and runs it on tensors in shared memory (docs/evaluator.md).
// The worker handle itself is the evaluator's own business (src/sandbox.h).

struct SpawnSpec;  // src/process.h

struct SandboxOptions {
  std::string worker_path;   // empty: $KF_SANDBOX_WORKER or the built kf-sandbox-worker
  std::string scratch_root;  // empty: $TMPDIR or /tmp; a private folder is made inside
  Backend backend = KF_BACKEND_CPU;
  int device = 0;
  int threads = 0;                                      // CPU threads for the kernel (0: hardware threads)
  int slots = 2;                                        // input/output sets held at once
  long cpu_seconds = 300;                               // RLIMIT_CPU of the worker
  unsigned long long memory_limit_bytes = 8ull << 30;   // RSS (and RLIMIT_AS on CPU) beyond shm
  unsigned long long scratch_limit_bytes = 2ull << 30;  // per call, via ctx->scratch_alloc
  unsigned long long flush_bytes = 0;                   // cache flush buffer (0: none)
  double start_timeout_s = 60;                          // worker start (CUDA context) and candidate load
  // CUDA: tensors live in one device allocation shared with the worker by CUDA IPC, so
  // nothing crosses PCIe (falls back to host staging, with a log line, if IPC fails).
  bool device_arena = true;
  bool drop_root = true;
  // Hook for the ModelNew path (evaluator/modelnew/): changes the worker's spawn (the Python
  // interpreter in front of argv, its environment, a private filesystem view) just before
  // it starts. Empty: kf-sandbox-worker as built.
  std::function<void(SpawnSpec&)> adjust_spawn;
};

// The physical identity of CUDA device `device` as seen by this process (its PCI bus id,
// e.g. "0000:19:00.0"), for the GPU timing lock; the ordinal as text without CUDA.
std::string gpu_lock_key(int device);

}  // namespace kf::evaluator

#ifndef KF_EVALUATOR_CORE_ONLY
#include "kf/common/config.h"
#include "kf/common/gpu_memory.h"
#include "kf/tasks/tasks.h"

namespace kf::evaluator {

// --- The verified evaluator

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

// --- Running out of GPU memory while verifying is the GPU's state (other processes of the run
// hold it), not the candidate's: a verification that hit it is tried again rather than
// scored. The evaluator service retries later without blocking its queue; the
// one-process stages (tools/selfsup) retry in place through evaluate_retrying_oom.

// The worker's harness could not set up (device, buffers, cuBLAS) for want of memory.
bool worker_out_of_memory(const Result& r);

// One verification; `out_of_memory` says why when the GPU ran out of memory (the evaluator
// process's allocation, c10::OutOfMemoryError, or the worker's set-up), else it is empty.
struct Attempt {
  Result result;
  std::string out_of_memory;
};
Attempt evaluate_once(Evaluator& ev, const tasks::Task& task, tasks::Backend backend, const CompileResult& compiled,
                      uint64_t candidate_seed);

// evaluate(), compiled once and verified up to `attempts` times while the GPU is out of
// memory, the allocator cache freed and delay x try waited between tries. After the last
// try the result is that runtime_error; `gave_up` (if given) is set when that happened.
Result evaluate_retrying_oom(Evaluator& ev, const tasks::Task& task, tasks::Backend backend, const std::string& source,
                             uint64_t candidate_seed, int attempts, std::chrono::milliseconds delay,
                             bool* gave_up = nullptr);

}  // namespace kf::evaluator
#endif  // KF_EVALUATOR_CORE_ONLY
