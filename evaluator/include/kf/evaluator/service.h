// EvaluatorService: the evaluator process's loop over the run's shared memory.
//
// Each step pops a batch of candidates from the candidate queue, submits every compile
// to the pool at once (compiles of the batch run while the first is verified), verifies
// each candidate against its task, pushes a Result record per candidate to the result
// queue, and inserts ok kernels into the kernel database with their speedup and policy
// version. Candidates the actor could not extract code from are scored compile_error
// with the extraction error as reason, so the learner sees the negative example.
// Counters go to the control block (role "evaluator"; counters below).
//
// Threading: one thread drives a service (it owns the Evaluator's timing). One service
// per GPU; CPU evaluators may run several.
#pragma once
#include <chrono>
#include <cstdint>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <string>

#include "kf/evaluator/evaluator.h"
#include "kf/replay/records.h"
#include "kf/replay/run_shm.h"
#include "kf/tasks/task.h"

namespace kf::evaluator {

// Control-block counters of an evaluator process.
enum ServiceCounter : int { kScored = 0, kOk = 1, kCheat = 2, kCompileError = 3, kKernelsInserted = 4 };

struct ServiceOptions {
  int evaluator_id = 0;
  tasks::Backend backend = tasks::Backend::CPU;
  std::string tasks_dir;                          // imported task artifacts
  std::size_t batch = 8;                          // candidates popped per step
  std::chrono::milliseconds pop_timeout{200};
  std::chrono::milliseconds push_timeout{5000};   // result queue full this long: dropped + logged
  // One JSON line per scored candidate is appended here (metrics/verdicts-<id>.jsonl of
  // the run; empty: none): time, task, level, policy version, verdict, speedup, reward,
  // compile/verify seconds and the reason's first 300 bytes. tools/report's per-minute
  // windows, per-level table and cheat list come from it.
  std::string verdict_log;
};

struct ServiceStats {
  uint64_t scored = 0, ok = 0, rejected_cheat = 0, compile_error = 0, kernels_inserted = 0, results_dropped = 0;
};

// The replay record of a verdict on candidate `c` (times in microseconds, spread p90-p10).
replay::Result to_record(const Result& r, const replay::Candidate& c, int evaluator_id);

class EvaluatorService {
 public:
  EvaluatorService(Evaluator& ev, replay::RunShm& shm, ServiceOptions o);
  ~EvaluatorService();
  EvaluatorService(const EvaluatorService&) = delete;
  EvaluatorService& operator=(const EvaluatorService&) = delete;

  // One batch (waits up to pop_timeout for the first candidate); returns how many scored.
  std::size_t step();
  // Scores one candidate without the queues.
  Result score(const replay::Candidate& c);
  // A task already loaded (serial mode); others load from tasks_dir on first use.
  void add_task(std::shared_ptr<const tasks::Task> t);
  // Called after each pushed (or dropped) result, e.g. to keep a log of verdicts.
  void on_result(std::function<void(const replay::Result&, const Result&)> fn) { on_result_ = std::move(fn); }
  const ServiceStats& stats() const { return stats_; }

 private:
  std::shared_ptr<const tasks::Task> task(const std::string& name, std::string* error);
  void account(const Result& r, const replay::Candidate& c);
  void log_verdict(const replay::Candidate& c, const Result& r, int level);
  Evaluator& ev_;
  replay::RunShm& shm_;
  ServiceOptions o_;
  int slot_ = -1;  // control-block entry
  ServiceStats stats_;
  std::map<std::string, std::shared_ptr<const tasks::Task>> tasks_;
  std::function<void(const replay::Result&, const Result&)> on_result_;
  std::ofstream verdicts_;  // o_.verdict_log, opened for append
};

}  // namespace kf::evaluator
