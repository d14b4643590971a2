// Serial mode (SerialRunner): one actor group, then the evaluator process's own loop over the
// queued candidates, in one process over the run's shared memory.
#include "kf/actors/actors.h"
#include "kf/evaluator/evaluator.h"

#include <time.h>

#include <chrono>

#include "kf/common/log.h"

namespace kf::actors {

SerialRunner::SerialRunner(Actor& actor, evaluator::Evaluator& ev, replay::RunShm& shm,
                           std::vector<std::shared_ptr<const tasks::Task>> tasks, tasks::Backend backend,
                           const std::string& verdict_log)
    : actor_(actor), shm_(shm) {
  evaluator::ServiceOptions so;
  so.backend = backend;
  so.verdict_log = verdict_log;
  so.pop_timeout = std::chrono::milliseconds(0);
  service_ = std::make_unique<evaluator::EvaluatorService>(ev, shm, so);
  for (auto& t : tasks) service_->add_task(t);
  service_->on_result([this](const replay::Result& rec, const evaluator::Result&) { results_.push_back(rec); });
}

SerialRunner::~SerialRunner() = default;  // EvaluatorService is complete here

StepResult SerialRunner::step() {
  const auto r = actor_.step();
  if (r == StepResult::pushed) ++stats_.groups;
  evaluate_pending();
  return r;
}

std::size_t SerialRunner::evaluate_pending() {
  std::size_t n = 0, k = 0;
  while ((k = service_->step()) > 0) n += k;  // each result goes into its group
  const auto& st = service_->stats();
  stats_.evaluated = st.scored;
  stats_.ok = st.ok;
  stats_.kernels_inserted = st.kernels_inserted;
  stats_.results_joined = shm_.replay().stats().results_joined;
  return n;
}

}  // namespace kf::actors
