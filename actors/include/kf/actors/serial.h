// Serial mode (Sample Factory style): actor -> evaluator -> replay in one process, over
// the same shared-memory pipes a multi-process run uses, for debugging and tests.
//
//   SerialRunner serial(actor, evaluator, shm, tasks, backend);
//   serial.step();   // one actor group, then every queued candidate evaluated and joined
//
// The evaluator side is the evaluator process's own loop (kf::evaluator::EvaluatorService):
// pops candidates, verifies each, writes the Result into its replay group, inserts ok
// kernels into the KernelDb (speedup, policy version); then the replay ingests the results.
// One thread.
#pragma once
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "kf/actors/actor.h"
#include "kf/evaluator/evaluator.h"
#include "kf/replay/replay.h"

namespace kf::actors {

struct SerialStats {
  uint64_t groups = 0, evaluated = 0, ok = 0, kernels_inserted = 0, results_joined = 0;
};

class SerialRunner {
 public:
  SerialRunner(Actor& actor, evaluator::Evaluator& ev, replay::RunShm& shm,
               std::vector<std::shared_ptr<const tasks::Task>> tasks, tasks::Backend backend,
               const std::string& verdict_log = "");  // ServiceOptions::verdict_log
  StepResult step();                                  // actor.step() then evaluate_pending()
  std::size_t evaluate_pending();                     // drains the candidate queue; returns how many evaluated
  const SerialStats& stats() const { return stats_; }
  const std::vector<replay::Result>& results() const { return results_; }  // every result produced

 private:
  Actor& actor_;
  replay::RunShm& shm_;
  std::unique_ptr<evaluator::EvaluatorService> service_;
  SerialStats stats_;
  std::vector<replay::Result> results_;
};

}  // namespace kf::actors
