#include "kf/actors/serial.h"

#include <time.h>

#include <chrono>

#include "kf/common/log.h"

namespace kf::actors {

replay::Result to_replay_result(const evaluator::Result& r, const replay::Candidate& c, int evaluator_id) {
  replay::Result o;
  o.candidate_id = c.id;
  o.group_id = c.group_id;
  o.index_in_group = c.index_in_group;
  switch (r.verdict) {
    case evaluator::Verdict::Ok: o.verdict = replay::Verdict::ok; break;
    case evaluator::Verdict::CompileError: o.verdict = replay::Verdict::compile_error; break;
    case evaluator::Verdict::RuntimeError: o.verdict = replay::Verdict::runtime_error; break;
    case evaluator::Verdict::Timeout: o.verdict = replay::Verdict::timeout; break;
    case evaluator::Verdict::Incorrect: o.verdict = replay::Verdict::incorrect; break;
    case evaluator::Verdict::RejectedCheat: o.verdict = replay::Verdict::rejected_cheat; break;
  }
  o.reason = r.reason;
  // Milliseconds in the evaluator, microseconds in the record; spread as p90 - p10.
  o.ref_time_median_us = r.ref_ms.median * 1e3;
  o.ref_time_spread_us = (r.ref_ms.p90 - r.ref_ms.p10) * 1e3;
  o.cand_time_median_us = r.cand_ms.median * 1e3;
  o.cand_time_spread_us = (r.cand_ms.p90 - r.cand_ms.p10) * 1e3;
  o.speedup = r.speedup;
  o.max_error = r.max_abs_error;
  o.checks_passed = static_cast<uint32_t>(r.checks_passed());
  o.reward = r.reward;
  o.evaluator_id = evaluator_id;
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  o.t_scored_ns = int64_t(ts.tv_sec) * 1000000000LL + ts.tv_nsec;
  return o;
}

SerialRunner::SerialRunner(Actor& actor, evaluator::Evaluator& ev, replay::RunShm& shm,
                           std::vector<std::shared_ptr<const tasks::Task>> tasks, tasks::Backend backend)
    : actor_(actor), ev_(ev), shm_(shm), backend_(backend) {
  for (auto& t : tasks) tasks_[t->name()] = t;
}

StepResult SerialRunner::step() {
  const auto r = actor_.step();
  if (r == StepResult::pushed) ++stats_.groups;
  evaluate_pending();
  return r;
}

std::size_t SerialRunner::evaluate_pending() {
  std::size_t n = 0;
  std::vector<replay::Candidate> batch;
  while (shm_.candidates().pop_batch(batch, 16, std::chrono::milliseconds(0)) > 0) {
    for (const auto& c : batch) {
      auto it = tasks_.find(c.task);
      evaluator::Result er;
      if (it == tasks_.end()) {
        er.verdict = evaluator::Verdict::CompileError;
        er.reason = "serial: unknown task '" + c.task + "'";
        er.reward = ev_.reward_model().failure_reward(evaluator::Verdict::CompileError);
      } else if (c.source.empty()) {
        er.verdict = evaluator::Verdict::CompileError;
        er.reason = c.extraction_error.empty() ? "empty source" : c.extraction_error;
        er.reward = ev_.reward_model().failure_reward(evaluator::Verdict::CompileError);
      } else {
        er = ev_.evaluate(*it->second, backend_, c.source, c.id);
      }
      auto rr = to_replay_result(er, c);
      ++n;
      ++stats_.evaluated;
      if (er.ok()) {
        ++stats_.ok;
        const auto out = shm_.kernels().insert({c.task, er.speedup, c.policy_version, c.source, 0});
        if (out == replay::InsertOutcome::inserted) ++stats_.kernels_inserted;
      }
      log_info("serial: candidate ", c.id, " of task ", c.task, ": ", replay::verdict_name(rr.verdict),
               rr.reason.empty() ? "" : " (" + rr.reason + ")", ", speedup ", rr.speedup);
      if (!shm_.results().push(rr, std::chrono::seconds(5)))
        log_error("serial: result queue full for 5 s; result of candidate ", c.id, " dropped");
      results_.push_back(rr);
    }
    batch.clear();
  }
  stats_.results_joined += 0;
  while (shm_.replay().ingest(shm_.results(), 64, std::chrono::milliseconds(0)) > 0) {
  }
  stats_.results_joined = shm_.replay().stats().results_joined;
  return n;
}

}  // namespace kf::actors
