// EvaluatorService: the evaluator process's loop over the run's shared memory.
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
#pragma once
#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>

#include "kf/evaluator/evaluator.h"
#include "kf/replay/records.h"
#include "kf/replay/run_shm.h"
#include "kf/tasks/tasks.h"

namespace kf::evaluator {

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
