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
//     EvaluatorService, service_options      the evaluator process over the run's shared
//                                            memory (kf_evaluator_service)
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
#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <fstream>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "kf/kernel.h"
#include "kf/replay/replay.h"

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
// replay.h), so the shared-memory Result record carries them as they are.

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
  // The speedup's 95 % interval from the paired trials (above: paired_speedup_interval).
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
// statistics (mean, std) of the raw scores of the last `window` ok results OF THE SAME
// TASK, and clipped to [-clip, clip]. Until the task has `min_samples`, the score is
// clip(speedup - 1). Per task because the point is to compare a kernel with its peers on
// the same problem: pooled statistics let a task with naturally large speedups set the
// scale for all, and scored members of one group against different means.
// Failure verdicts get fixed rewards, below -clip by default so that a slow correct
// kernel always beats a broken one.
// Other kinds: "speedup" (clip(speedup - 1)), "log_speedup" (clip(log speedup)).
// `ok_bonus` is added to every ok result's reward in every kind (default 0): a term for
// correctness alone, so that a slow correct kernel is clearly above a broken one.
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
  double ok_bonus = 0.0;
  double compile_error = -3.0, runtime_error = -3.0, timeout = -3.0, incorrect = -3.0, rejected_cheat = -4.0;
};

class RewardModel {
 public:
  explicit RewardModel(RewardOptions o = {});
  // Scores one result of `task` (and, for ok results, updates that task's statistics).
  double score(Verdict v, double speedup, const std::string& task = "");
  // As above (task: r.task), and a degenerate task's ok result gets neutral_reward().
  double score(const Result& r);
  // The reward of speedup 1.0 on `task` under the configured kind, without updating the statistics.
  double neutral_reward(const std::string& task = "") const;
  double failure_reward(Verdict v) const;
  // The running statistics of one task's ok speedups (cuda_l1).
  double running_mean(const std::string& task = "") const;
  double running_std(const std::string& task = "") const;
  int samples(const std::string& task = "") const;

 private:
  struct Window {
    std::deque<double> recent;
    double sum = 0, sum2 = 0;
  };
  const Window* window_of(const std::string& task) const;       // null when the task has none; mu_ held
  double speed_score(double speedup, const std::string& task);  // the kind's score, without ok_bonus
  RewardOptions o_;
  mutable std::mutex mu_;
  std::map<std::string, Window> windows_;
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
  // The worker sees no other process: a private /proc that lists only its own user's
  // processes, and a user of its own (not nobody, which other workers share). Needs root and
  // Linux >= 5.8, else the worker runs without it and the evaluator says so once. On CUDA
  // only with private_proc_cuda (evaluator.private_proc_cuda, kf-eval --private-proc-cuda):
  // the CUDA driver's reads of /proc and its IPC under another user have not been measured
  // on a GPU (dev/gpu_verifier_evidence.sh runs the CUDA corpus both ways).
  bool private_proc = true;
  bool private_proc_cuda = false;
  // Hook for the ModelNew path (evaluator/modelnew/): changes the worker's spawn (the Python
  // interpreter in front of argv, its environment, a private filesystem view) just before
  // it starts. Empty: kf-sandbox-worker as built.
  std::function<void(SpawnSpec&)> adjust_spawn;
};

// Reference and candidate under the same OpenMP settings: the sandbox worker's threads
// sleep as soon as they wait (OMP_WAIT_POLICY=PASSIVE, GOMP_SPINCOUNT=0: its checks read
// threads that keep working outside the call as cheating). The evaluator's OpenMP runtime
// (torch's) reads these at load, before main; left spinning, its idle threads took the
// CPU from the reference's working ones on a loaded host (a 1.5 ms ReLU timed at 4-16 ms)
// and made a copy of the reference 1.7-3x "faster". A process that times references
// calls this first: unless the environment already says so, it sets both and executes
// itself again (/proc/self/exe, the same arguments); if that fails it logs and goes on.
void exec_with_worker_openmp();

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
  uint64_t seed = 0;  // run seed; input seeds derive from (seed, candidate seed, check_seed)
  // The secret seed of the checks (their kinds, call positions and inputs): 0 draws a fresh
  // one from the operating system per evaluation; the result's check anti.check_plan
  // records it, and setting it here replays that verification.
  uint64_t check_seed = 0;
  int device = 0;       // CUDA device of reference and worker
  int cpu_threads = 0;  // threads for the reference and the kernel (0: hardware)

  // correctness
  int correctness_sets = 3;  // K fresh sets from the task's distribution
  // Global stress sets (every element changed alike): x*8, then others drawn per candidate
  // from -x, x+3, uniform(-4,4), x*1e-3.
  int stress_sets = 2;
  // Local stress: one set with three large values of different magnitudes per row, one
  // with 8 of halving magnitudes scattered in the tensor (one per floating input when an
  // output is a reduction), magnitudes tried from large to smaller until the reference
  // stays finite; and two numeric-edge sets (values past exp overflow and underflow, and
  // rows scaled to underflow, in a few rows). A kernel that probes a few hundred elements
  // cannot see them.
  bool local_stress = true;
  // A near-duplicate of the call before (a few elements in a few rows changed): the output
  // must follow (a cache keyed on a sparse fingerprint of the inputs returns stale rows).
  bool near_duplicate = true;
  // Re-drawn parameters (all of them around their init), a near-duplicate of the
  // parameters (a few elements of each re-drawn, the rest as before), and with two or more
  // float parameters one tensor at a time: one re-drawn whole, and a few elements of only
  // the largest.
  bool redraw_params = true;
  double stress_atol_scale_cap = 64;  // stress atol grows with output magnitude, up to this

  // timing
  int warmup = 2;
  int trials = 10;
  // More trials while the spread is too wide; still too wide after max_trials: the verdict
  // stays ok, flagged timing_unstable, with the conservative speedup (the interval's low end).
  int max_trials = 30;
  double max_spread = 0.5;  // (p90 - p10) / median, for reference and candidate
  // A candidate whose speedup after 3 timed trials is under this is timed no further (the
  // checks among the trials still run): a kernel 1000x slower than the reference held the
  // GPU timing lock for a minute otherwise. 0: always time every trial.
  double slow_speedup = 0.05;
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
  // The candidate's time is the evaluator's clock around the worker less the protocol's
  // cost (median of interleaved empty calls), or the worker's clock where it says more. A
  // worker clock under that by more than this (absolute, or relative to it, whichever is
  // larger) on more than half of the timed calls is rejected as tampered with.
  double timer_slack_ms = 0.5;
  double timer_slack_frac = 0.25;
  // The reference timed before any candidate runs (this many runs after two
  // warm-ups; 0: no baseline), fastest run against fastest timed trial: slower by more than
  // ref_slowdown_limit makes the verdict an environment failure, never a speedup.
  int ref_baseline_runs = 5;
  double ref_slowdown_limit = 2.0;
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
// scored. The evaluator service retries later without blocking its queue (below); the
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

// --- EvaluatorService: the evaluator process's loop over the run's shared memory.
//
// Each step claims a batch of candidate handles from the candidate queue and reads each
// candidate from its replay group (CandidateQueue::claim), submits every compile to the
// pool at once (compiles of the batch run while the first is verified), verifies each
// candidate against its task, writes a Result record per candidate into its replay group
// (ReplayBuffer::add_result: into the candidate's empty result slot), and inserts ok
// kernels into the kernel database with their speedup and policy version. A claimed
// handle stays in its queue slot until the result is in the group; only then is the
// claim acknowledged (released). If the evaluator dies first, the claim goes back to the
// queue (replay.candidate_queue.max_claims; see docs/replay.md): whoever reaps it (the
// next evaluator at start-up, a waiting evaluator, or the launcher when it sees the
// death) logs it; the evaluator that claims it next finds the result already in the group
// and acknowledges it without scoring it again. A handle whose group is gone (evicted, or
// taken at its deadline) is counted lost (dropped_by_consumer; ServiceStats::lost_group_gone,
// counter kLost) with a log line and nothing is scored. A result whose group went while
// it was verified is counted orphan by the replay and logged. A result that cannot be
// stored (the replay threw) is counted lost (dropped_by_consumer) with a log line; a stop
// signal gives the rest of the batch back to the queue.
// Candidates the actor could not extract code from are scored compile_error
// with the extraction error as reason, so the learner sees the negative example.
// Counters go to the control block (role "evaluator"; counters below).
//
// Degenerate tasks (Result::task_degenerate): an ok kernel is still inserted into the
// kernel database, with speedup 1.0 (it is correct; its measured speedup means nothing),
// and its result is marked exclude_from_training unless train_on_degenerate_tasks; one
// log line per task.
//
// Running out of GPU memory is the machine's state, not the kernel's fault (other
// processes on a shared GPU hold memory; the big tasks' input sets take GiBs): when the
// evaluator's own allocation fails (c10::OutOfMemoryError) or the sandbox worker cannot
// allocate the inputs/outputs ("fatal: cudaMalloc ...: out of memory"), the caching
// allocator is emptied and the candidate is put back, to be verified again after
// oom_retry_delay x attempt; only after oom_attempts tries is it scored runtime_error.
// The process never dies of it.
//
// Threading: one thread drives a service (it owns the Evaluator's timing). One service
// per GPU; CPU evaluators may run several.

// Control-block counters of an evaluator process.
// kEnvironment: verdicts the machine caused (Result::cause environment, e.g. the sandbox
// worker killed from outside); kLost: candidates this evaluator counted lost (their group
// was gone when it read them, or their result could not be stored); kDegenerate: results
// of tasks flagged degenerate.
enum ServiceCounter : int {
  kScored = 0,
  kOk = 1,
  kCheat = 2,
  kCompileError = 3,
  kKernelsInserted = 4,
  kEnvironment = 5,
  kLost = 6,
  kDegenerate = 7
};

struct ServiceOptions {
  int evaluator_id = 0;
  tasks::Backend backend = tasks::Backend::CPU;
  std::string tasks_dir;  // imported task artifacts
  std::size_t batch = 8;  // candidates popped per step
  std::chrono::milliseconds pop_timeout{200};
  // One JSON line per scored candidate is appended here (metrics/verdicts-<id>.jsonl of
  // the run; empty: none): time, task, level, policy version, verdict, speedup, reward,
  // compile/verify seconds and the reason's first 300 bytes. tools/report's per-minute
  // windows, per-level table and cheat list come from it.
  std::string verdict_log;
  int oom_attempts = 3;  // tries per candidate when the GPU is out of memory
  std::chrono::milliseconds oom_retry_delay{5000};
  // CUDA: after a candidate, the allocator cache is given back to the driver when it holds
  // more than this (0: never). Without it each evaluator keeps the peak of the biggest task
  // it has seen, and several evaluators on one GPU run each other out of memory.
  std::size_t cache_limit_bytes = 0;
  // Set by a signal handler (kf-evaluator): step() stops after the candidate in hand and
  // leaves the rest of its batch unscored, so that a stopping run is not kept waiting for
  // up to `batch` verifications (the launcher kills evaluators 15 s after SIGTERM).
  const std::atomic<bool>* stop = nullptr;
  bool train_on_degenerate_tasks = false;  // evaluator.train_on_degenerate_tasks
  // Candidates of another format (kf-evaluator sets both: KernelBench ModelNew sources go to
  // evaluator/modelnew/): a source other_format accepts is not compiled as an ABI kernel;
  // score_other gives its verdict.
  std::function<bool(const std::string& source)> other_format;
  std::function<Result(const tasks::Task&, tasks::Backend, const std::string& source, uint64_t id)> score_other;
};

// From the run's config: run.backend, tasks.dir, evaluator.cache_limit_gb,
// evaluator.train_on_degenerate_tasks (throws
// kf::Error naming the file and key for a bad value). Id and verdict log are the caller's.
ServiceOptions service_options(const Config& cfg);

struct ServiceStats {
  uint64_t scored = 0, ok = 0, rejected_cheat = 0, compile_error = 0, kernels_inserted = 0, results_dropped = 0;
  uint64_t environment = 0, degenerate = 0, given_back = 0;
  uint64_t lost_group_gone = 0;  // handles whose group was gone (evicted, taken at its deadline): lost, not scored
  uint64_t already_scored = 0;   // handles back in the queue whose result was already in the group: acknowledged
};

// The replay record of a verdict on candidate `c` (times in microseconds, spread p90-p10),
// with the speedup interval and the timing_unstable / task_degenerate flags;
// exclude_from_training = task_degenerate && !train_on_degenerate_tasks.
replay::Result to_record(const Result& r, const replay::Candidate& c, int evaluator_id,
                         bool train_on_degenerate_tasks = false);

// One line of a verdict log (metrics/verdicts-<id>.jsonl; JSON, no newline): time, task,
// level, policy version, verdict, speedup, reward, compile/verify seconds, the reason's
// first 300 bytes. EvaluatorService writes it per scored candidate; kf-evaluator --remote
// writes the same lines on an evaluator node.
std::string verdict_json_line(const replay::Candidate& c, const Result& r, int level, int evaluator_id);

class EvaluatorService {
 public:
  // Registers with the control block and reaps the candidate queue, so that claims of a
  // dead evaluator go back to the queue before this one starts.
  EvaluatorService(Evaluator& ev, replay::RunShm& shm, ServiceOptions o);
  ~EvaluatorService();  // gives candidates still waiting for an out-of-memory retry back to the queue
  EvaluatorService(const EvaluatorService&) = delete;
  EvaluatorService& operator=(const EvaluatorService&) = delete;

  // One batch (waits up to pop_timeout for the first candidate); returns how many scored.
  std::size_t step();
  // Scores one candidate without the queues.
  Result score(const replay::Candidate& c);
  // A task already loaded (serial mode); others load from tasks_dir on first use.
  void add_task(std::shared_ptr<const tasks::Task> t);
  // Called after each stored (or dropped) result, e.g. to keep a log of verdicts.
  void on_result(std::function<void(const replay::Result&, const Result&)> fn) { on_result_ = std::move(fn); }
  const ServiceStats& stats() const { return stats_; }
  // Candidates put back after running out of GPU memory, not yet verified again (a
  // draining evaluator waits for them).
  std::size_t pending_retries() const { return retry_.size(); }

 private:
  std::shared_ptr<const tasks::Task> task(const std::string& name, std::string* error);
  void account(const Result& r, const replay::Candidate& c);
  void log_verdict(const replay::Candidate& c, const Result& r, int level);
  // Out of GPU memory on `c` (attempt `attempt`, 0-based): frees the allocator cache and
  // queues a retry; false when the attempts are used up (then it is scored).
  bool retry_out_of_memory(const replay::Candidate& c, replay::ShmQueue::Slot claim, int attempt,
                           const std::string& what);
  void give_back(replay::ShmQueue::Slot claim, uint64_t id, const char* why);
  struct Retry {
    replay::Candidate c;
    replay::ShmQueue::Slot claim;
    int attempt = 0;  // tries so far
    std::chrono::steady_clock::time_point due;
  };
  Evaluator& ev_;
  replay::RunShm& shm_;
  ServiceOptions o_;
  int slot_ = -1;  // control-block entry
  ServiceStats stats_;
  std::map<std::string, std::shared_ptr<const tasks::Task>> tasks_;
  std::function<void(const replay::Result&, const Result&)> on_result_;
  std::ofstream verdicts_;  // o_.verdict_log, opened for append
  std::deque<Retry> retry_;
  std::set<std::string> degenerate_logged_;  // tasks whose degenerate flag was logged
};

}  // namespace kf::evaluator
#endif  // KF_EVALUATOR_CORE_ONLY
