// kf/evaluator/evaluator.h: what other folders call of the evaluator.
//   torch-free (kf_evaluator_core; KF_EVALUATOR_CORE_ONLY sees only it): TimeSummary,
//   CompileOptions/CompileService, Result/Check/Verdict/Cause, RewardOptions, SandboxOptions,
//   gpu_lock_key. With torch: EvalOptions, Evaluator, evaluate_retrying_oom, EvaluatorService.
// The kernel ABI is kf/kernel.h; internals: evaluator/src/*.h; protocol: docs/evaluator.md.
//
// The verified evaluator: compile, run in a sandbox worker against the task's reference:
//   kf::evaluator::Evaluator ev(opts);
//   Result r = ev.evaluate(*task, kf::tasks::Backend::CPU, source, /*candidate_seed=*/id);
// An ok verdict means: the kernel writes every output element, leaves its inputs alone,
// matches the reference within the dtype's tolerance on fresh, stress, re-drawn-parameter
// and near-duplicate input sets and on every timed call (in an order drawn per candidate);
// its results follow its inputs and no work escapes the timed region. The speedup is a
// ratio of medians of interleaved trials on fresh inputs, with a 95 % interval.
//
// Threading: an Evaluator may be used by one thread at a time for evaluate() (it owns
// the device's timing); its CompileService may be used from any thread meanwhile.
#pragma once
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <future>
#include <memory>
#include <string>
#include <vector>

#include "kf/kernel.h"
#include "kf/replay/replay.h"

namespace kf::evaluator {

// --- Timing summaries of repeated trials. Pure functions; any thread.

struct TimeSummary {
  int n = 0;
  double median = 0, p10 = 0, p90 = 0, min = 0, max = 0, mean = 0;
  // (p90 - p10) / median: the relative spread the give-up rule looks at.
  double spread() const { return median > 0 ? (p90 - p10) / median : 0; }
};
TimeSummary summarize(const std::vector<double>& v);

// --- Compile service: candidate source -> shared object, through a content-addressed cache
// and a TBB pool.
//
// A source compiles once per compiler and flag set (failures are cached too), in its own
// process group with time, memory and output limits; a compile error is a result, never an
// exception. The compiler runs confined (src/compile.h); if the confinement cannot be set
// up the compile fails with the reason: it never runs unconfined.
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
  // The speedup's 95 % interval from the paired trials (distribution-free, src/stats.h).
  double speedup_lo = 0, speedup_hi = 0;
  bool timing_unstable = false;                 // correct, time not stable after max_trials: speedup is speedup_lo
  double max_abs_error = 0, max_rel_error = 0;  // over every checked call
  bool nondeterministic = false;  // identical calls gave different bits at the sampled positions (within tolerance)
  bool task_degenerate = false;   // reference output (nearly) constant / input-independent
  std::string degenerate_reason;
  std::vector<Check> checks;
  double reward = 0;
  double compile_s = 0, verify_s = 0;
  double gpu_claim_gb = 0, gpu_peak_gb = 0;                // CUDA: GPU memory claimed, and the most held
  double claim_wait_s = 0, lock_wait_s = 0, timing_s = 0;  // CUDA: where verify_s went
  int timed_trials = 0;
  bool ok() const { return verdict == Verdict::ok; }
  int checks_passed() const;
};

std::string to_json(const Result& r, int indent = -1);
std::string to_text(const Result& r);

// --- Reward settings (the model itself: src/reward.h). Default kind "cuda_l1": speedup
// normalised by the running statistics of the same task's last `window` ok results,
// clipped to [-clip, clip]; "speedup" (clip(speedup - 1)), "log_speedup" (clip(log
// speedup)). Failure verdicts get these fixed rewards; `ok_bonus` is added to every ok
// result. A degenerate task's ok result is scored as speedup 1.0.

struct RewardOptions {
  std::string kind = "cuda_l1";
  double clip = 2.0;
  int window = 1024;
  int min_samples = 16;
  double min_std = 0.05;
  double ok_bonus = 0.0;
  double compile_error = -3.0, runtime_error = -3.0, timeout = -3.0, incorrect = -3.0, rejected_cheat = -4.0;
};
class RewardModel;  // src/reward.h

// --- Sandbox options: the sandbox worker process (kf-sandbox-worker) that loads one
// untrusted candidate and runs it on tensors in shared memory (the handle: src/sandbox.h).

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
  bool device_arena = true;                             // CUDA: tensors in one device allocation shared by IPC
  bool drop_root = true;
  // A private /proc and a user of its own (root, Linux >= 5.8; on CUDA only with private_proc_cuda).
  bool private_proc = true;
  bool private_proc_cuda = false;
  std::function<void(SpawnSpec&)> adjust_spawn;  // the ModelNew path changes the worker's spawn
};

// The physical identity of CUDA device `device` as seen by this process (its PCI bus id,
// e.g. "0000:19:00.0"), for the GPU timing lock; the ordinal as text without CUDA.
std::string gpu_lock_key(int device);

}  // namespace kf::evaluator

#ifndef KF_EVALUATOR_CORE_ONLY
#include "kf/common/config.h"
#include "kf/tasks/tasks.h"

namespace kf::evaluator {

// --- The verified evaluator

struct EvalOptions {
  CompileOptions compile;
  SandboxOptions sandbox;  // backend/device are set per evaluation
  RewardOptions reward;
  uint64_t seed = 0;  // run seed; input seeds derive from (seed, candidate seed, check_seed)
  // The checks' secret seed: 0 draws one per evaluation (check anti.check_plan records it;
  // setting it here replays that verification).
  uint64_t check_seed = 0;
  int device = 0;       // CUDA device of reference and worker
  int cpu_threads = 0;  // threads for the reference and the kernel (0: hardware)

  // correctness
  int correctness_sets = 3;           // K fresh sets from the task's distribution
  int stress_sets = 2;                // global stress sets (every element changed alike)
  bool local_stress = true;           // large values in a few rows, numeric-edge sets
  bool near_duplicate = true;         // a near-duplicate of the call before: the output must follow
  bool redraw_params = true;          // re-drawn parameters (all, near-duplicate, one tensor at a time)
  double stress_atol_scale_cap = 64;  // stress atol grows with output magnitude, up to this

  // timing
  int warmup = 2;
  int trials = 10;
  int max_trials = 30;         // more while the spread is too wide (then: timing_unstable)
  double max_spread = 0.5;     // (p90 - p10) / median, for reference and candidate
  double slow_speedup = 0.05;  // under this after 3 trials: timed no further (0: time every trial)
  bool flush_cache = true;
  // CUDA: each timed trial holds the run's exclusive GPU timing lock (kf/common/gpu_lock.h).
  bool gpu_lock = true;
  std::string gpu_lock_dir;         // empty: $KF_GPU_LOCK_DIR or /tmp
  double gpu_lock_timeout_s = 120;  // longer: an installation problem (kf::Error), not the kernel's
  // CUDA: a verification first claims its GPU memory from a budget of this fraction of the
  // GPU's, shared by the GPU's evaluators (kf/common/gpu_memory.h). 0: no claims.
  double gpu_memory_fraction = 0.7;
  unsigned long long flush_bytes = 0;  // 0: CPU 2x LLC (<= 256 MiB), CUDA 256 MiB

  // limits and anti-cheat thresholds (what each checks: docs/evaluator.md)
  double min_call_timeout_s = 10;   // per kernel call, wall clock
  double call_timeout_factor = 50;  // x reference median
  double probe_ms = 5;              // quiet window after return, then outputs re-read
  double late_cpu_ms = 2.0;         // CPU other threads may use in the probe window
  double idle_cpu_ms = 2.0;         // CPU other threads may use between calls
  double presync_ms = 1.0;          // CUDA: a device sync before the clock may take this long
  double resume_ms = 2.0;           // reported: timed calls that started this late after the resume
  double outside_cpu_ms = 0.2;      // CPU of the worker's other threads outside the call
  double gpu_settle_ms = 0.5;       // CUDA: device busy after the worker stopped at return
  double timer_slack_ms = 0.5;      // the worker's clock under the evaluator's by more than
  double timer_slack_frac = 0.25;   // these on most timed calls: tampered with
  int ref_baseline_runs = 5;        // reference timed first (0: not); slower at the trials by
  double ref_slowdown_limit = 2.0;  // more than this: an environment failure, never a speedup
  double degenerate_rel = 1e-6;     // reference output spread below this x scale: degenerate
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
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Running out of GPU memory while verifying is the GPU's state (other processes of the run
// hold it), not the candidate's: such a verification is tried again rather than scored.
// evaluate(), compiled once and verified up to `attempts` times while the GPU is out of
// memory, the allocator cache freed and delay x try waited between tries. After the last
// try the result is that runtime_error; `gave_up` (if given) is set when that happened.
// (EvaluatorService retries later instead, without blocking its other candidates.)
Result evaluate_retrying_oom(Evaluator& ev, const tasks::Task& task, tasks::Backend backend, const std::string& source,
                             uint64_t candidate_seed, int attempts, std::chrono::milliseconds delay,
                             bool* gave_up = nullptr);

// --- EvaluatorService: the evaluator process's loop, the same on every node.
//
// Each step claims a batch from a replay::CandidateSource (this node's shared-memory queue,
// or the head's candidate stream: kf::transport::open_candidates), compiles the batch on the
// pool, verifies each candidate and completes its claim with the result record (the source
// stores it, enters a verified kernel by replay::kernel_entry_of, then acknowledges it). A
// result the source could not store is dropped (counted lost); a stop signal gives the rest
// of the batch back. Out of GPU memory, a claim is held and verified again later, scored
// runtime_error (environment) after oom_attempts; the process never dies of it. Held claims
// are kept alive (source.keep_alive) from a small thread while verifying. With a control
// block (one node, the head) it registers as "evaluator", heartbeats and adds the
// replay::counter::kEval* counters; an evaluator node has none. (Details: src/service.h.)
//
// Threading: one thread drives a service (it owns the Evaluator's timing). One service
// per GPU; CPU evaluators may run several.

struct ServiceOptions {
  int evaluator_id = 0;
  tasks::Backend backend = tasks::Backend::CPU;
  std::string tasks_dir;  // imported task artifacts
  std::size_t batch = 8;  // candidates claimed per step
  std::chrono::milliseconds pop_timeout{200};
  std::string verdict_log;  // one JSON line per scored candidate (metrics/verdicts-<id>.jsonl; empty: none)
  int oom_attempts = 3;     // tries per candidate when the GPU is out of memory
  std::chrono::milliseconds oom_retry_delay{5000};
  std::chrono::milliseconds keep_alive_every{0};  // held claims kept alive this often (0: never)
  // CUDA: the allocator cache is given back after a candidate when over this (0: never).
  std::size_t cache_limit_bytes = 0;
  // Set by a signal handler: step() gives the rest of its batch back after the candidate in hand.
  const std::atomic<bool>* stop = nullptr;
  bool train_on_degenerate_tasks = false;  // evaluator.train_on_degenerate_tasks
  // Another candidate format (kf-evaluator: KernelBench ModelNew sources, evaluator/modelnew/):
  // a source other_format accepts is not compiled as an ABI kernel; score_other scores it.
  std::function<bool(const std::string& source)> other_format;
  std::function<Result(const tasks::Task&, tasks::Backend, const std::string& source, uint64_t id)> score_other;
};

// From the run's config: run.backend, tasks.dir, evaluator.cache_limit_gb,
// evaluator.train_on_degenerate_tasks, cluster.redis.claim_idle_s (throws kf::Error naming
// the file and key for a bad value). Id and verdict log are the caller's.
ServiceOptions service_options(const Config& cfg);

struct ServiceStats {
  uint64_t scored = 0, ok = 0, rejected_cheat = 0, compile_error = 0, kernels_inserted = 0, results_dropped = 0;
  uint64_t environment = 0, degenerate = 0, given_back = 0;
  uint64_t lost_group_gone = 0;  // claims whose group was gone (evicted, taken at its deadline): lost, not scored
  uint64_t already_scored = 0;   // claims whose result was already stored: acknowledged, not scored
  uint64_t late = 0;             // results stored after another evaluator's for the same candidate (not counted)
};

class EvaluatorService {
 public:
  // `source` and `control` (null: none, as on an evaluator node) outlive the service.
  EvaluatorService(Evaluator& ev, replay::CandidateSource& source, replay::ControlBlock* control, ServiceOptions o);
  // One node: the run's candidate queue (replay::shm_candidates) and its control block.
  EvaluatorService(Evaluator& ev, replay::RunShm& shm, ServiceOptions o);
  ~EvaluatorService();  // gives claims still waiting for an out-of-memory retry back to the source
  EvaluatorService(const EvaluatorService&) = delete;
  EvaluatorService& operator=(const EvaluatorService&) = delete;

  // One batch (waits up to pop_timeout for the first); returns how many scored. Throws
  // what the source threw (it could not reach its queue).
  std::size_t step();
  Result score(const replay::Candidate& c);  // one candidate, without a source
  // A task already loaded (serial mode); others load from tasks_dir on first use.
  void add_task(std::shared_ptr<const tasks::Task> t);
  // Called after each stored (or dropped) result.
  void on_result(std::function<void(const replay::Result&, const Result&)> fn);
  const ServiceStats& stats() const;
  // Claims held after running out of GPU memory, not yet verified again (a draining
  // evaluator waits for them).
  std::size_t pending_retries() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kf::evaluator
#endif  // KF_EVALUATOR_CORE_ONLY
