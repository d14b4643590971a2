// EvaluatorService: the evaluator process's loop over a replay::CandidateSource, the same
// on every node (kf/evaluator/evaluator.h; how a step goes: service.h).
#include "service.h"

#include <time.h>

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <fstream>
#include <future>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>

#include "attempt.h"
#include "kf/common/config.h"
#include "kf/common/error.h"
#include "kf/common/log.h"
#include "kf/tasks/tasks.h"
#include "reward.h"

namespace kf::evaluator {
namespace {

namespace counter = replay::counter;

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

std::string who_of(const ServiceOptions& o) { return "evaluator " + std::to_string(o.evaluator_id); }

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
  // The network source gives a claim away after claim_idle_s without a keep-alive: renew
  // three times per period (the shared-memory source ignores it).
  const double idle_s = c.get_float("cluster.redis.claim_idle_s");
  o.keep_alive_every =
      std::max(std::chrono::milliseconds(100), std::chrono::milliseconds(static_cast<long long>(idle_s * 1000 / 3)));
  return o;
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

struct EvaluatorService::Impl {
  Impl(Evaluator& e, replay::CandidateSource& s, replay::ControlBlock* ctl, ServiceOptions opts);
  ~Impl();

  std::size_t step();
  Result score(const replay::Candidate& c);
  std::shared_ptr<const tasks::Task> task(const std::string& name, std::string* error);
  void account(const Result& r, const replay::Candidate& c);
  void log_verdict(const replay::Candidate& c, const Result& r, int level);
  // Out of GPU memory on `claim` (attempt `attempt`, 0-based): frees the allocator cache and
  // holds the claim for a retry; false when the attempts are used up (then it is scored).
  bool retry_out_of_memory(const replay::Claim& claim, int attempt, const std::string& what);
  void give_back(const replay::Claim& claim, const char* why);
  void count(int id, uint64_t n) {
    if (control && slot >= 0 && n) control->add_counter(slot, id, n);
  }
  void heartbeat() {
    if (control && slot >= 0) control->heartbeat(slot);
  }
  // The claims the keeper renews: batch[from..] and the held retries.
  void hold(const std::vector<replay::Claim>& batch, std::size_t from);
  void keep_alive_loop();

  struct Retry {
    replay::Claim claim;
    int attempt = 0;  // tries so far
    std::chrono::steady_clock::time_point due;
  };
  Evaluator& ev;
  std::unique_ptr<replay::CandidateSource> owned;  // the one-node constructor's source
  replay::CandidateSource& source;
  replay::ControlBlock* control;  // null on an evaluator node
  ServiceOptions o;
  std::string who;  // "evaluator N", for log lines
  int slot = -1;    // control-block entry
  ServiceStats stats;
  uint64_t seen_gone = 0, seen_scored = 0;  // the source's unresolved counts already accounted
  std::map<std::string, std::shared_ptr<const tasks::Task>> tasks;
  std::function<void(const replay::Result&, const Result&)> on_result;
  std::ofstream verdicts;  // o.verdict_log, opened for append
  std::deque<Retry> retry;
  std::set<std::string> degenerate_logged;  // tasks whose degenerate flag was logged
  // The keeper thread (ServiceOptions::keep_alive_every > 0).
  std::mutex held_mu;
  std::condition_variable held_cv;
  std::vector<replay::Claim> held;
  bool stopping = false;
  std::thread keeper;
};

EvaluatorService::Impl::Impl(Evaluator& e, replay::CandidateSource& s, replay::ControlBlock* ctl, ServiceOptions opts)
    : ev(e), source(s), control(ctl), o(std::move(opts)), who(who_of(o)) {
  if (!o.verdict_log.empty()) {
    verdicts.open(o.verdict_log, std::ios::app);
    if (!verdicts)
      throw Error(o.verdict_log + ": cannot open the verdict log for append (" + std::strerror(errno) + ")");
  }
  if (control) slot = control->register_process("evaluator", o.evaluator_id);
  if (o.keep_alive_every.count() > 0) keeper = std::thread([this] { keep_alive_loop(); });
}

EvaluatorService::Impl::~Impl() {
  for (auto& r : retry) {
    try {
      give_back(r.claim, "the evaluator stops while it waits for an out-of-memory retry");
    } catch (const std::exception& e) {
      log_error(who, ": giving candidate ", r.claim.candidate.id, " back failed: ", e.what(),
                "; the source hands it to another evaluator when this one is gone");
    }
  }
  if (keeper.joinable()) {
    {
      std::lock_guard<std::mutex> g(held_mu);
      stopping = true;
    }
    held_cv.notify_all();
    keeper.join();
  }
  if (slot >= 0) control->unregister_process(slot);
}

void EvaluatorService::Impl::hold(const std::vector<replay::Claim>& batch, std::size_t from) {
  if (!keeper.joinable()) return;
  std::vector<replay::Claim> h(batch.begin() + std::ptrdiff_t(std::min(from, batch.size())), batch.end());
  for (const auto& r : retry) h.push_back(r.claim);
  std::lock_guard<std::mutex> g(held_mu);
  held.swap(h);
}

void EvaluatorService::Impl::keep_alive_loop() {
  std::unique_lock<std::mutex> lk(held_mu);
  while (!held_cv.wait_for(lk, o.keep_alive_every, [this] { return stopping; })) {
    if (held.empty()) continue;
    const std::vector<replay::Claim> h = held;
    lk.unlock();
    try {
      source.keep_alive(h);
    } catch (const std::exception& e) {
      log_warn(who, ": keeping ", h.size(), " claim(s) alive at ", source.where(), " failed: ", e.what(),
               "; retried at the next beat");
    }
    lk.lock();
  }
}

EvaluatorService::EvaluatorService(Evaluator& ev, replay::CandidateSource& source, replay::ControlBlock* control,
                                   ServiceOptions o)
    : impl_(std::make_unique<Impl>(ev, source, control, std::move(o))) {}

EvaluatorService::EvaluatorService(Evaluator& ev, replay::RunShm& shm, ServiceOptions o) {
  auto source = replay::shm_candidates(shm, who_of(o));
  impl_ = std::make_unique<Impl>(ev, *source, &shm.control(), std::move(o));
  impl_->owned = std::move(source);
}

EvaluatorService::~EvaluatorService() = default;

std::size_t EvaluatorService::step() { return impl_->step(); }
Result EvaluatorService::score(const replay::Candidate& c) { return impl_->score(c); }
void EvaluatorService::add_task(std::shared_ptr<const tasks::Task> t) { impl_->tasks[t->name()] = std::move(t); }
void EvaluatorService::on_result(std::function<void(const replay::Result&, const Result&)> fn) {
  impl_->on_result = std::move(fn);
}
const ServiceStats& EvaluatorService::stats() const { return impl_->stats; }
std::size_t EvaluatorService::pending_retries() const { return impl_->retry.size(); }

void EvaluatorService::Impl::give_back(const replay::Claim& claim, const char* why) {
  try {
    source.give_back(claim);
  } catch (const std::exception& e) {
    throw SourceError("giving candidate " + std::to_string(claim.candidate.id) + " back to " + source.where() +
                      " failed: " + e.what());
  }
  ++stats.given_back;
  log_warn(who, ": candidate ", claim.candidate.id, " goes back unscored to ", source.where(), " (", why,
           "); another evaluator scores it");
}

void EvaluatorService::Impl::log_verdict(const replay::Candidate& c, const Result& r, int level) {
  if (!verdicts.is_open()) return;
  verdicts << verdict_json_line(c, r, level, o.evaluator_id) << '\n' << std::flush;
  if (!verdicts) {
    log_error(who, ": writing ", o.verdict_log, " failed; the verdict log stops here, scoring goes on");
    verdicts.close();
  }
}

std::shared_ptr<const tasks::Task> EvaluatorService::Impl::task(const std::string& name, std::string* error) {
  auto it = tasks.find(name);
  if (it != tasks.end()) return it->second;
  try {
    auto t = tasks::Task::load(o.tasks_dir + "/" + name);
    if (!t->has_backend(o.backend)) {
      *error = "task '" + name + "' has no " + tasks::backend_name(o.backend) + " artifact in " + o.tasks_dir;
      return nullptr;
    }
    tasks[name] = t;
    return t;
  } catch (const kf::Error& e) {
    *error = e.what();
    return nullptr;
  }
}

Result EvaluatorService::Impl::score(const replay::Candidate& c) {
  auto fail = [&](Verdict v, const std::string& reason, Cause cause) {
    Result r;
    r.task = c.task;
    r.backend = tasks::backend_name(o.backend);
    r.verdict = v;
    r.cause = cause;
    r.reason = reason;
    r.reward = ev.reward_model().failure_reward(v);
    return r;
  };
  if (c.source.empty())
    return fail(Verdict::compile_error, c.extraction_error.empty() ? "no kernel source" : c.extraction_error,
                Cause::kernel);
  std::string err;
  auto t = task(c.task, &err);
  if (!t) {
    log_error(who, ": cannot score candidate ", c.id, ": ", err,
              "; it is scored runtime_error and the evaluator goes on");
    return fail(Verdict::runtime_error, "evaluator: " + err, Cause::environment);
  }
  if (o.other_format && o.score_other && o.other_format(c.source)) return o.score_other(*t, o.backend, c.source, c.id);
  return ev.evaluate(*t, o.backend, c.source, c.id);
}

void EvaluatorService::Impl::account(const Result& r, const replay::Candidate& c) {
  ++stats.scored;
  count(counter::kEvalScored, 1);
  count(replay::ControlBlock::kWorkMs, static_cast<uint64_t>(r.verify_s * 1e3));
  count(replay::ControlBlock::kCompileMs, static_cast<uint64_t>(r.compile_s * 1e3));
  if (r.verdict == Verdict::rejected_cheat) ++stats.rejected_cheat, count(counter::kEvalCheat, 1);
  if (r.verdict == Verdict::compile_error) ++stats.compile_error, count(counter::kEvalCompileError, 1);
  if (r.cause == Cause::environment) ++stats.environment, count(counter::kEvalEnvironment, 1);
  if (r.task_degenerate) {
    ++stats.degenerate;
    count(counter::kEvalDegenerate, 1);
    if (degenerate_logged.insert(c.task).second)
      log_warn(who, ": task ", c.task, " is degenerate (",
               r.degenerate_reason.empty() ? "reference output nearly input-independent" : r.degenerate_reason,
               "); its ok kernels enter the kernel database with speedup 1.0 and its results ",
               o.train_on_degenerate_tasks ? "still go to the learner (evaluator.train_on_degenerate_tasks)"
                                           : "are left out of training (evaluator.train_on_degenerate_tasks: false)");
  }
  if (r.ok()) ++stats.ok, count(counter::kEvalOk, 1);
}

bool EvaluatorService::Impl::retry_out_of_memory(const replay::Claim& claim, int attempt, const std::string& what) {
  const replay::Candidate& c = claim.candidate;
  tasks::release_device_cache();
  const std::string why = what.substr(0, what.find('\n')).substr(0, 200);
  if (attempt + 1 >= o.oom_attempts) {
    log_error(who, ": out of GPU memory verifying candidate ", c.id, " of ", c.task, " on ", attempt + 1, " tries (",
              why, "); it is scored runtime_error and the evaluator goes on");
    return false;
  }
  const auto delay = o.oom_retry_delay * (attempt + 1);
  log_warn(who, ": out of GPU memory verifying candidate ", c.id, " of ", c.task, " (", why,
           "); cache freed, verified again in ", delay.count(), " ms (try ", attempt + 2, " of ", o.oom_attempts, ")");
  retry.push_back({claim, attempt + 1, std::chrono::steady_clock::now() + delay});
  return true;
}

std::size_t EvaluatorService::Impl::step() {
  heartbeat();
  std::vector<replay::Claim> batch;
  std::vector<int> attempts;  // tries so far, per candidate of the batch
  // Claims held after running out of GPU memory go first once due.
  const auto now = std::chrono::steady_clock::now();
  while (!retry.empty() && retry.front().due <= now && batch.size() < o.batch) {
    batch.push_back(std::move(retry.front().claim));
    attempts.push_back(retry.front().attempt);
    retry.pop_front();
  }
  if (batch.empty()) {
    // Claims whose group is gone or that were scored already are settled inside the source
    // (each with a log line) and only counted here.
    try {
      source.claim(batch, o.batch, o.pop_timeout);
    } catch (const std::exception& e) {
      throw SourceError("claiming candidates from " + source.where() + " failed: " + e.what());
    }
    const uint64_t gone = source.unresolved_gone(), scored = source.unresolved_scored();
    if (gone > seen_gone) stats.lost_group_gone += gone - seen_gone, count(counter::kEvalLost, gone - seen_gone);
    if (scored > seen_scored) stats.already_scored += scored - seen_scored;
    seen_gone = gone, seen_scored = scored;
    if (batch.empty()) return 0;
    attempts.assign(batch.size(), 0);
  }
  hold(batch, 0);
  std::size_t done = 0;
  // Compile the whole batch on the pool while the first candidates are verified.
  const Backend abi = abi_backend(o.backend);
  std::vector<std::shared_future<CompileResult>> compiles(batch.size());
  std::vector<char> other(batch.size(), 0);  // another format (ServiceOptions::other_format): not compiled here
  for (std::size_t i = 0; i < batch.size(); ++i) {
    const std::string& src = batch[i].candidate.source;
    other[i] = !src.empty() && o.other_format && o.score_other && o.other_format(src);
    if (!src.empty() && !other[i]) compiles[i] = ev.compiler().submit(src, abi);
  }
  for (std::size_t i = 0; i < batch.size(); ++i) {
    if (i > 0 && o.stop && o.stop->load()) {
      log_warn(who, ": stopping on a signal; ", batch.size() - i, " candidate(s) of its batch go back unscored to ",
               source.where());
      for (std::size_t j = i; j < batch.size(); ++j) give_back(batch[j], "stop signal");
      break;
    }
    const replay::Claim& claim = batch[i];
    const replay::Candidate& c = claim.candidate;
    Result r;
    std::string err;
    std::shared_ptr<const tasks::Task> t;
    if (c.source.empty() || !(t = task(c.task, &err))) {
      r = score(c);  // the failure paths (no source, unknown task), with their log lines
    } else {
      std::string oom;  // why, when the GPU ran out of memory
      try {
        if (other[i]) {
          r = o.score_other(*t, o.backend, c.source, c.id);
        } else {
          Attempt a = evaluate_once(ev, *t, o.backend, compiles[i].get(), c.id);
          r = std::move(a.result);
          oom = std::move(a.out_of_memory);
        }
      } catch (const kf::Error& e) {
        // The task or the installation, not the candidate: say so, score it, go on.
        log_error(who, ": verifying candidate ", c.id, " failed: ", e.what(),
                  "; scored runtime_error, the evaluator goes on");
        r.verdict = Verdict::runtime_error;
        r.cause = Cause::environment;
        r.reason = std::string("evaluator error: ") + e.what();
        r.reward = ev.reward_model().failure_reward(Verdict::runtime_error);
      }
      if (!oom.empty() && retry_out_of_memory(claim, attempts[i], oom)) {
        hold(batch, i + 1);
        continue;
      }
      if (!oom.empty()) {
        r.cause = Cause::environment;
        r.reason = "out of GPU memory on " + std::to_string(o.oom_attempts) + " tries: " + r.reason;
      }
    }
    ++done;
    const int level = t ? t->level() : 0;
    account(r, c);
    log_verdict(c, r, level);
    const replay::Result rec = to_record(r, c, o.evaluator_id, o.train_on_degenerate_tasks);
    // The source stores the result, enters a verified kernel, then acknowledges the claim
    // (a kill in between scores it twice, never zero times).
    replay::Completion out;
    bool stored = false;
    try {
      out = source.complete(claim, rec);
      stored = true;
    } catch (const std::exception& e) {
      ++stats.results_dropped;
      count(counter::kEvalLost, 1);
      log_error(who, ": storing the result of candidate ", c.id, " in ", source.where(), " failed (", e.what(),
                "); the candidate is counted lost and its group will hit its deadline");
      try {
        source.drop(claim);
      } catch (const std::exception& d) {
        throw SourceError("dropping candidate " + std::to_string(c.id) + " at " + source.where() +
                          " failed: " + d.what());
      }
    }
    if (stored && out.kernel_inserted) ++stats.kernels_inserted, count(counter::kEvalKernelsInserted, 1);
    if (stored && !out.first) ++stats.late;
    hold(batch, i + 1);
    log_info(who, ": candidate ", c.id, " of ", c.task, " (level ", level, "): ", verdict_name(r.verdict),
             r.cause == Cause::environment ? " [environment]" : "", r.reason.empty() ? "" : " (" + r.reason + ")",
             r.ok() ? ", speedup " + std::to_string(r.speedup) : "",
             !stored      ? "; not stored: counted lost"
             : !out.first ? "; a late duplicate: another evaluator's result for it counts"
             : !out.joined
                 ? "; not joined: its group is gone (evicted, or taken at its deadline) or it was scored already"
                 : "");
    if (on_result) on_result(rec, r);
    if (o.backend == tasks::Backend::CUDA && o.cache_limit_bytes > 0 &&
        tasks::device_cache_reserved_bytes() > o.cache_limit_bytes)
      tasks::release_device_cache();
    heartbeat();
  }
  hold({}, 0);
  return done;
}

}  // namespace kf::evaluator
