// EvaluatorService (see kf/evaluator/evaluator.h).
#include "kf/evaluator/evaluator.h"

#include <time.h>

#include <cerrno>
#include <cstring>
#include <future>
#include <nlohmann/json.hpp>

#include "kf/common/config.h"
#include "kf/common/error.h"
#include "kf/common/log.h"
#include "kf/tasks/tasks.h"

namespace kf::evaluator {
namespace {

int64_t monotonic_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t(ts.tv_sec) * 1000000000LL + ts.tv_nsec;
}

// The compiler's first error line for the verdict log, its file path cut to the file name
// (the cache folder differs per source), so that tools/report can count errors by kind.
std::string first_diagnostic(const std::string& diagnostics) {
  std::string line = diagnostics.substr(0, diagnostics.find('\n'));
  const auto colon = line.find(':');
  const auto slash = line.rfind('/', colon);
  if (colon != std::string::npos && slash != std::string::npos) line.erase(0, slash + 1);
  return line.substr(0, 240);
}

// Every line of the compiler's output with its path cut to the file name, as first_diagnostic
// does for one line: the cache folder is a host path the policy has no business seeing.
std::string diagnostics_without_paths(const std::string& diagnostics) {
  std::string out;
  std::size_t start = 0;
  while (start < diagnostics.size()) {
    std::size_t end = diagnostics.find('\n', start);
    if (end == std::string::npos) end = diagnostics.size();
    out += first_diagnostic(diagnostics.substr(start, end - start));
    out += '\n';
    start = end + 1;
  }
  return out;
}

}  // namespace

replay::Result to_record(const Result& r, const replay::Candidate& c, int evaluator_id,
                         bool train_on_degenerate_tasks) {
  replay::Result o;
  o.candidate_id = c.id;
  o.group_id = c.group_id;
  o.index_in_group = c.index_in_group;
  o.verdict = r.verdict;
  o.cause = r.cause;
  // A compile error keeps the compiler's lines (file paths cut to the file name): a follow-up
  // turn quotes them to the policy. The replay truncates the reason to its result region.
  o.reason = r.verdict == Verdict::compile_error && !r.diagnostics.empty()
                 ? r.reason + ":\n" + diagnostics_without_paths(r.diagnostics)
                 : r.reason;
  o.ref_time_median_us = r.ref_ms.median * 1e3;
  o.ref_time_spread_us = (r.ref_ms.p90 - r.ref_ms.p10) * 1e3;
  o.cand_time_median_us = r.cand_ms.median * 1e3;
  o.cand_time_spread_us = (r.cand_ms.p90 - r.cand_ms.p10) * 1e3;
  o.speedup = r.speedup;
  o.max_error = r.max_abs_error;
  o.checks_passed = uint32_t(r.checks_passed());
  o.reward = r.reward;
  o.evaluator_id = evaluator_id;
  o.t_scored_ns = monotonic_ns();
  o.speedup_lo = r.speedup_lo;
  o.speedup_hi = r.speedup_hi;
  o.timing_unstable = r.timing_unstable;
  o.task_degenerate = r.task_degenerate;
  o.exclude_from_training = r.task_degenerate && !train_on_degenerate_tasks;
  return o;
}

ServiceOptions service_options(const Config& c) {
  ServiceOptions o;
  o.backend = tasks::resolve_backend(c.get_string("run.backend"));
  o.tasks_dir = c.get_string("tasks.dir");
  const double gb = c.get_float("evaluator.cache_limit_gb");
  if (!(gb >= 0)) throw error_at(c.source(), "evaluator.cache_limit_gb: " + std::to_string(gb) + " must be at least 0");
  o.cache_limit_bytes = static_cast<std::size_t>(gb * double(1ull << 30));
  o.train_on_degenerate_tasks = c.get_bool("evaluator.train_on_degenerate_tasks");
  return o;
}

EvaluatorService::EvaluatorService(Evaluator& ev, replay::RunShm& shm, ServiceOptions o)
    : ev_(ev), shm_(shm), o_(std::move(o)) {
  if (!o_.verdict_log.empty()) {
    verdicts_.open(o_.verdict_log, std::ios::app);
    if (!verdicts_)
      throw Error(o_.verdict_log + ": cannot open the verdict log for append (" + std::strerror(errno) + ")");
  }
  slot_ = shm_.control().register_process("evaluator", o_.evaluator_id);
  // Claims of evaluators that died go back to the queue now (each logged by the queue).
  const std::size_t reaped = shm_.candidates().raw().reap();
  if (reaped)
    log_warn("evaluator ", o_.evaluator_id, ": at start-up, reclaimed ", reaped,
             " candidate slot(s) held by dead processes (see the lines above)");
}

void EvaluatorService::give_back(replay::ShmQueue::Slot claim, uint64_t id, const char* why) {
  shm_.candidates().raw().give_back(&claim, 1);
  ++stats_.given_back;
  log_warn("evaluator ", o_.evaluator_id, ": candidate ", id, " goes back to the candidate queue unscored (", why,
           "); another evaluator scores it");
}

std::string verdict_json_line(const replay::Candidate& c, const Result& r, int level, int evaluator_id) {
  const double now = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  const nlohmann::json j = {{"t", now},
                            {"evaluator", evaluator_id},
                            {"candidate", c.id},
                            {"group", c.group_id},
                            {"index", c.index_in_group},
                            {"turn", c.turn},
                            {"parent_group", c.parent_group_id},
                            {"parent_index", c.parent_index},
                            {"task", c.task},
                            {"level", level},
                            {"policy_version", c.policy_version},
                            {"actor", c.actor_id},
                            {"verdict", verdict_name(r.verdict)},
                            {"speedup", r.ok() ? r.speedup : 0.0},
                            {"speedup_lo", r.ok() ? r.speedup_lo : 0.0},
                            {"speedup_hi", r.ok() ? r.speedup_hi : 0.0},
                            {"timing_unstable", r.timing_unstable},
                            {"task_degenerate", r.task_degenerate},
                            {"environment", r.cause == Cause::environment},
                            {"reward", r.reward},
                            {"compile_s", r.compile_s},
                            {"verify_s", r.verify_s},
                            {"gpu_claim_gb", r.gpu_claim_gb},
                            {"gpu_peak_gb", r.gpu_peak_gb},
                            {"claim_wait_s", r.claim_wait_s},
                            {"lock_wait_s", r.lock_wait_s},
                            {"timing_s", r.timing_s},
                            {"timed_trials", r.timed_trials},
                            {"reason", r.reason.substr(0, 300)},
                            {"diagnostic", r.verdict == Verdict::compile_error ? first_diagnostic(r.diagnostics) : ""}};
  // A cut multi-byte character is replaced, not thrown on.
  if (c.probe) {  // a learning-curve probe sample (actors.probe): never trained on
    nlohmann::json p = j;
    p["probe"] = true;
    return p.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  }
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

void EvaluatorService::log_verdict(const replay::Candidate& c, const Result& r, int level) {
  if (!verdicts_.is_open()) return;
  verdicts_ << verdict_json_line(c, r, level, o_.evaluator_id) << '\n' << std::flush;
  if (!verdicts_) {
    log_error("evaluator ", o_.evaluator_id, ": writing ", o_.verdict_log,
              " failed; the verdict log stops here, scoring goes on");
    verdicts_.close();
  }
}

EvaluatorService::~EvaluatorService() {
  for (auto& r : retry_) {
    try {
      give_back(r.claim, r.c.id, "the evaluator stops while it waits for an out-of-memory retry");
    } catch (const std::exception& e) {
      log_error("evaluator ", o_.evaluator_id, ": giving candidate ", r.c.id, " back failed: ", e.what(),
                "; its claim is reaped when this process has exited");
    }
  }
  if (slot_ >= 0) shm_.control().unregister_process(slot_);
}

void EvaluatorService::add_task(std::shared_ptr<const tasks::Task> t) { tasks_[t->name()] = std::move(t); }

std::shared_ptr<const tasks::Task> EvaluatorService::task(const std::string& name, std::string* error) {
  auto it = tasks_.find(name);
  if (it != tasks_.end()) return it->second;
  try {
    auto t = tasks::Task::load(o_.tasks_dir + "/" + name);
    if (!t->has_backend(o_.backend)) {
      *error = "task '" + name + "' has no " + tasks::backend_name(o_.backend) + " artifact in " + o_.tasks_dir;
      return nullptr;
    }
    tasks_[name] = t;
    return t;
  } catch (const kf::Error& e) {
    *error = e.what();
    return nullptr;
  }
}

Result EvaluatorService::score(const replay::Candidate& c) {
  auto fail = [&](Verdict v, const std::string& reason, Cause cause) {
    Result r;
    r.task = c.task;
    r.backend = tasks::backend_name(o_.backend);
    r.verdict = v;
    r.cause = cause;
    r.reason = reason;
    r.reward = ev_.reward_model().failure_reward(v);
    return r;
  };
  if (c.source.empty())
    return fail(Verdict::compile_error, c.extraction_error.empty() ? "no kernel source" : c.extraction_error,
                Cause::kernel);
  std::string err;
  auto t = task(c.task, &err);
  if (!t) {
    log_error("evaluator ", o_.evaluator_id, ": cannot score candidate ", c.id, ": ", err,
              "; it is scored runtime_error and the evaluator goes on");
    return fail(Verdict::runtime_error, "evaluator: " + err, Cause::environment);
  }
  if (o_.other_format && o_.score_other && o_.other_format(c.source))
    return o_.score_other(*t, o_.backend, c.source, c.id);
  return ev_.evaluate(*t, o_.backend, c.source, c.id);
}

void EvaluatorService::account(const Result& r, const replay::Candidate& c) {
  ++stats_.scored;
  auto& ctl = shm_.control();
  ctl.add_counter(slot_, kScored, 1);
  ctl.add_counter(slot_, replay::ControlBlock::kWorkMs, static_cast<uint64_t>(r.verify_s * 1e3));
  ctl.add_counter(slot_, replay::ControlBlock::kCompileMs, static_cast<uint64_t>(r.compile_s * 1e3));
  if (r.verdict == Verdict::rejected_cheat) ++stats_.rejected_cheat, ctl.add_counter(slot_, kCheat, 1);
  if (r.verdict == Verdict::compile_error) ++stats_.compile_error, ctl.add_counter(slot_, kCompileError, 1);
  if (r.cause == Cause::environment) ++stats_.environment, ctl.add_counter(slot_, kEnvironment, 1);
  if (r.task_degenerate) {
    ++stats_.degenerate;
    ctl.add_counter(slot_, kDegenerate, 1);
    if (degenerate_logged_.insert(c.task).second)
      log_warn("evaluator ", o_.evaluator_id, ": task ", c.task, " is degenerate (",
               r.degenerate_reason.empty() ? "reference output nearly input-independent" : r.degenerate_reason,
               "); its ok kernels enter the kernel database with speedup 1.0 and its results ",
               o_.train_on_degenerate_tasks ? "still go to the learner (evaluator.train_on_degenerate_tasks)"
                                            : "are left out of training (evaluator.train_on_degenerate_tasks: false)");
  }
  if (!r.ok()) return;
  ++stats_.ok;
  ctl.add_counter(slot_, kOk, 1);
  // A degenerate task's speedup measures nothing: its correct kernels never rank as fast.
  const double db_speedup = r.task_degenerate ? 1.0 : r.speedup;
  const auto out = shm_.kernels().insert({c.task, db_speedup, c.policy_version, c.source, 0});
  if (out == replay::InsertOutcome::inserted) ++stats_.kernels_inserted, ctl.add_counter(slot_, kKernelsInserted, 1);
}

bool EvaluatorService::retry_out_of_memory(const replay::Candidate& c, replay::ShmQueue::Slot claim, int attempt,
                                           const std::string& what) {
  tasks::release_device_cache();
  const std::string why = what.substr(0, what.find('\n')).substr(0, 200);
  if (attempt + 1 >= o_.oom_attempts) {
    log_error("evaluator ", o_.evaluator_id, ": out of GPU memory verifying candidate ", c.id, " of ", c.task, " on ",
              attempt + 1, " tries (", why, "); it is scored runtime_error and the evaluator goes on");
    return false;
  }
  const auto delay = o_.oom_retry_delay * (attempt + 1);
  log_warn("evaluator ", o_.evaluator_id, ": out of GPU memory verifying candidate ", c.id, " of ", c.task, " (", why,
           "); cache freed, verified again in ", delay.count(), " ms (try ", attempt + 2, " of ", o_.oom_attempts, ")");
  retry_.push_back({c, claim, attempt + 1, std::chrono::steady_clock::now() + delay});
  return true;
}

std::size_t EvaluatorService::step() {
  shm_.control().heartbeat(slot_);
  std::vector<replay::Candidate> batch;
  std::vector<replay::ShmQueue::Slot> claims;  // batch[i]'s slot, released once its result is stored
  std::vector<int> attempts;                   // tries so far, per candidate of the batch
  // Candidates put back after running out of GPU memory go first once due.
  const auto now = std::chrono::steady_clock::now();
  while (!retry_.empty() && retry_.front().due <= now && batch.size() < o_.batch) {
    batch.push_back(std::move(retry_.front().c));
    claims.push_back(retry_.front().claim);
    attempts.push_back(retry_.front().attempt);
    retry_.pop_front();
  }
  if (batch.empty()) {
    // The queue carries handles: each is resolved in its replay group here. One whose group
    // is gone is counted lost and one already scored is acknowledged, each with a log line
    // (CandidateQueue::claim); neither is scored.
    replay::Unresolved un;
    const std::size_t got = shm_.candidates().claim(batch, claims, o_.batch, o_.pop_timeout,
                                                    "evaluator " + std::to_string(o_.evaluator_id), &un);
    if (!un.gone.empty()) {
      stats_.lost_group_gone += un.gone.size();
      shm_.control().add_counter(slot_, kLost, un.gone.size());
    }
    stats_.already_scored += un.scored.size();
    if (got == 0) return 0;
    attempts.assign(batch.size(), 0);
  }
  std::size_t done = 0;
  // Compile the whole batch on the pool while the first candidates are verified.
  const Backend abi = abi_backend(o_.backend);
  std::vector<std::shared_future<CompileResult>> compiles(batch.size());
  std::vector<char> other(batch.size(), 0);  // another format (ServiceOptions::other_format): not compiled here
  for (std::size_t i = 0; i < batch.size(); ++i) {
    other[i] = !batch[i].source.empty() && o_.other_format && o_.score_other && o_.other_format(batch[i].source);
    if (!batch[i].source.empty() && !other[i]) compiles[i] = ev_.compiler().submit(batch[i].source, abi);
  }
  for (std::size_t i = 0; i < batch.size(); ++i) {
    if (i > 0 && o_.stop && o_.stop->load()) {
      log_warn("evaluator ", o_.evaluator_id, ": stopping on a signal; ", batch.size() - i,
               " candidate(s) of its batch go back to the candidate queue unscored");
      for (std::size_t j = i; j < batch.size(); ++j) give_back(claims[j], batch[j].id, "stop signal");
      break;
    }
    const replay::Candidate& c = batch[i];
    Result r;
    std::string err;
    std::shared_ptr<const tasks::Task> t;
    if (c.source.empty() || !(t = task(c.task, &err))) {
      r = score(c);  // the failure paths (no source, unknown task), with their log lines
    } else {
      std::string oom;  // why, when the GPU ran out of memory
      try {
        if (other[i]) {
          r = o_.score_other(*t, o_.backend, c.source, c.id);
        } else {
          Attempt a = evaluate_once(ev_, *t, o_.backend, compiles[i].get(), c.id);
          r = std::move(a.result);
          oom = std::move(a.out_of_memory);
        }
      } catch (const kf::Error& e) {
        // The task or the installation, not the candidate: say so, score it, go on.
        log_error("evaluator ", o_.evaluator_id, ": verifying candidate ", c.id, " failed: ", e.what(),
                  "; scored runtime_error, the evaluator goes on");
        r.verdict = Verdict::runtime_error;
        r.cause = Cause::environment;
        r.reason = std::string("evaluator error: ") + e.what();
        r.reward = ev_.reward_model().failure_reward(Verdict::runtime_error);
      }
      if (!oom.empty() && retry_out_of_memory(c, claims[i], attempts[i], oom)) continue;
      if (!oom.empty()) {
        r.cause = Cause::environment;
        r.reason = "out of GPU memory on " + std::to_string(o_.oom_attempts) + " tries: " + r.reason;
      }
    }
    ++done;
    account(r, c);
    log_verdict(c, r, t ? t->level() : 0);
    const replay::Result rec = to_record(r, c, o_.evaluator_id, o_.train_on_degenerate_tasks);
    // The result goes into its group's empty slot; the claim is acknowledged only after
    // that (a kill before the release puts the candidate back in the queue: scored again,
    // the second result is counted duplicate and dropped by the replay).
    bool joined = false;
    try {
      joined = shm_.replay().add_result(rec);
      shm_.candidates().raw().release(&claims[i], 1);
    } catch (const std::exception& e) {
      ++stats_.results_dropped;
      shm_.candidates().raw().drop(&claims[i], 1);
      shm_.control().add_counter(slot_, kLost, 1);
      log_error("evaluator ", o_.evaluator_id, ": storing the result of candidate ", c.id, " in the replay failed (",
                e.what(),
                "); the candidate is counted lost (candidate queue: dropped_by_consumer) and its group "
                "will hit its deadline");
    }
    log_info(
        "evaluator ", o_.evaluator_id, ": candidate ", c.id, " of ", c.task, ": ", verdict_name(r.verdict),
        r.cause == Cause::environment ? " [environment]" : "", r.reason.empty() ? "" : " (" + r.reason + ")",
        r.ok() ? ", speedup " + std::to_string(r.speedup) : "",
        joined ? "" : "; not joined: its group is gone (evicted, or taken at its deadline) or it was scored already");
    if (on_result_) on_result_(rec, r);
    if (o_.backend == tasks::Backend::CUDA && o_.cache_limit_bytes > 0 &&
        tasks::device_cache_reserved_bytes() > o_.cache_limit_bytes)
      tasks::release_device_cache();
    shm_.control().heartbeat(slot_);
  }
  return done;
}

}  // namespace kf::evaluator
