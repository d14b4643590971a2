// The actor loop (Actor, kf/actors/actors.h; its state: actor_impl.h): sample groups from the
// current policy and publish them through a replay::GroupSink; multi-turn follow-ups and the
// learning-curve probe read their held groups back through the same sink.
#include "kf/actors/actors.h"

#include "kf/common/metrics.h"

#include <dirent.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "kf/common/error.h"
#include "kf/common/log.h"
#include "kf/common/run_dir.h"
#include "actor_impl.h"
#include "prompt.h"
#include "weights_blob.h"

namespace kf::actors {

namespace {

namespace ctr = replay::counter;
using Clock = std::chrono::steady_clock;
double secs(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }

// Adds the seconds from its construction to its end of scope to one of the time split's counters.
struct AddSeconds {
  double& acc;
  Clock::time_point t0 = Clock::now();
  ~AddSeconds() { acc += secs(t0, Clock::now()); }
};

int64_t mono_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t(ts.tv_sec) * 1000000000LL + ts.tv_nsec;
}

uint64_t splitmix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ULL;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}

// Ids unique across actors and restarts: wall clock, pid, actor id and a counter, mixed.
uint64_t fresh_id(int actor, uint64_t counter) {
  timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  uint64_t x = splitmix(uint64_t(ts.tv_sec) * 1000000000ULL + uint64_t(ts.tv_nsec));
  x = splitmix(x ^ (uint64_t(::getpid()) << 32) ^ uint64_t(actor));
  x = splitmix(x ^ counter);
  return x ? x : 1;
}

bool is_dir(const std::string& p) {
  struct stat st;
  return ::stat(p.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

}  // namespace

std::vector<std::shared_ptr<const tasks::Task>> load_actor_tasks(const ActorOptions& o, bool strict) {
  std::vector<std::shared_ptr<const tasks::Task>> all, out;
  if (!o.include.empty()) {
    for (const auto& name : o.include) {
      const std::string dir = o.tasks_dir + "/" + name;
      if (!is_dir(dir)) {
        if (strict) throw Error("tasks.include: no task '" + name + "' in " + o.tasks_dir);
        log_warn("actor: task '", name, "' (tasks.include) is not in ", o.tasks_dir, ": left out of the schedule");
        continue;
      }
      try {
        all.push_back(tasks::Task::load(dir));
      } catch (const Error& e) {
        if (strict) throw Error("tasks.include: task '" + name + "' cannot be loaded: " + e.what());
        log_warn("actor: task '", name, "' cannot be loaded (", e.what(), "): left out of the schedule");
      }
    }
  } else {
    all = tasks::Task::load_all(o.tasks_dir);
  }
  std::size_t held_out = 0;
  for (auto& t : all) {
    if (o.include.empty() && std::find(o.levels.begin(), o.levels.end(), t->level()) == o.levels.end()) continue;
    if (std::find(o.heldout.begin(), o.heldout.end(), t->name()) != o.heldout.end()) {
      // tasks.include naming a held-out task contradicts the split: the preflight says so.
      if (strict && !o.include.empty())
        throw Error("tasks.include: task '" + t->name() + "' is in the held-out list (tasks.heldout)");
      ++held_out;
      continue;
    }
    if (!t->has_backend(o.backend)) {
      log_warn("actor: task '", t->name(), "' has no ", tasks::backend_name(o.backend),
               " artifact (import it with --backends): left out of the schedule");
      continue;
    }
    out.push_back(t);
  }
  if (held_out) log_info("actor: ", held_out, " held-out task(s) (tasks.heldout) left out of the schedule");
  if (out.empty())
    throw Error("actor: no usable task in " + o.tasks_dir + " for backend " + tasks::backend_name(o.backend) +
                " (tasks.levels / tasks.include / tasks.heldout)");
  return out;
}

Actor::Impl::Impl(ActorOptions opts, ActorPolicy policy, std::vector<std::shared_ptr<const tasks::Task>> tasks,
                  replay::RunShm& shm, std::unique_ptr<replay::GroupSink> sink)
    : opts_(std::move(opts)), policy_(std::move(policy)), tasks_(std::move(tasks)), shm_(shm), sink_(std::move(sink)) {
  if (!sink_) throw Error("actor " + std::to_string(opts_.id) + ": no group sink to publish to");
  std::vector<TaskEntry> entries;
  for (const auto& t : tasks_) entries.push_back({t->name(), t->level()});
  sched_ = std::make_unique<TaskScheduler>(entries, opts_.schedule, opts_.seed ^ splitmix(uint64_t(opts_.id) + 1));
  const std::string tpl =
      resolve_tree_path(opts_.template_path.empty() ? "configs/prompts/contrastive.txt" : opts_.template_path);
  tpl_ = PromptTemplate::load(tpl);
  if (opts_.turns > 1) {
    const std::string fb =
        resolve_tree_path(opts_.feedback_path.empty() ? "configs/prompts/feedback.txt" : opts_.feedback_path);
    feedback_ = FeedbackTemplate::load(fb);
    log_info("actor ", opts_.id, ": multi-turn refinement, up to ", opts_.turns, " answers per member, feedback ", fb);
  }
  const std::string abi =
      resolve_tree_path(opts_.abi_header_path.empty() ? "evaluator/include/kf/kernel.h" : opts_.abi_header_path);
  abi_ = compact_abi(read_file(abi));
  gpu_share_ = policy::GpuShare(policy_.model->options().device());
  if (opts_.engine_max_sequences > 0) {
    policy::EngineOptions eo;
    eo.max_sequences = opts_.engine_max_sequences;
    eo.kv_budget_mb = opts_.engine_kv_budget_mb;
    eo.block_size = opts_.engine_block_size;
    eo.check_every = opts_.engine_check_every;
    eo.cuda_graph = opts_.engine_cuda_graph;
    eo.seed = opts_.seed ^ splitmix(uint64_t(opts_.id) + 0x5EED);
    eo.gpu_share = &gpu_share_;
    engine_ = std::make_unique<policy::Engine>(policy_.model, eo);
    const auto es = engine_->stats();
    log_info("actor ", opts_.id, ": rollout engine, up to ", eo.max_sequences, " sequences, KV pool ", es.blocks_total,
             " blocks of ", eo.block_size, " tokens (", eo.kv_budget_mb, " MB)");
  }
  slot_ = shm_.control().register_process("actor", opts_.id);
  if (opts_.context_tokens == 0) opts_.context_tokens = policy_.config.max_position_embeddings;
  if (opts_.context_tokens <= opts_.max_new_tokens)
    throw Error("actors.prompt.context_tokens (" + std::to_string(opts_.context_tokens) +
                ") must exceed actors.sampling.max_new_tokens (" + std::to_string(opts_.max_new_tokens) + ")");
  // The model's chat template (a bad one fails here, not at the first prompt).
  const auto chat = policy::ChatTemplate::for_model(opts_.policy_dir, opts_.chat_vars);
  log_info("actor ", opts_.id, ": ", tasks_.size(), " tasks, G=", opts_.group_size, ", K=", opts_.exemplars, ", mode ",
           prompt_mode_name(opts_.mode), ", context ", opts_.context_tokens, " tokens, template ", tpl,
           ", chat template ", chat ? chat->source() : std::string("none (raw text)"), ", groups to ", sink_->where());
  setup_probe();
}

Actor::Impl::~Impl() {
  release_held();
  if (groups_log_) std::fclose(groups_log_);
  if (slot_ >= 0) shm_.control().unregister_process(slot_);
}

// --- Actor: the public face (kf/actors/actors.h) over Impl.

Actor::Actor(ActorOptions opts, ActorPolicy policy, std::vector<std::shared_ptr<const tasks::Task>> tasks,
             replay::RunShm& shm, std::unique_ptr<replay::GroupSink> sink)
    : impl_(std::make_unique<Impl>(std::move(opts), std::move(policy), std::move(tasks), shm, std::move(sink))) {}

Actor::Actor(ActorOptions opts, ActorPolicy policy, std::vector<std::shared_ptr<const tasks::Task>> tasks,
             replay::RunShm& shm) {
  auto sink = replay::shm_groups(shm, "actor " + std::to_string(opts.id));
  impl_ = std::make_unique<Impl>(std::move(opts), std::move(policy), std::move(tasks), shm, std::move(sink));
}

Actor::~Actor() = default;
StepResult Actor::step() { return impl_->step(); }
void Actor::run(const std::atomic<bool>* stop) { impl_->run(stop); }
void Actor::request_stop() { impl_->stop_ = true; }
bool Actor::refresh_weights() { return impl_->refresh_weights(); }
int64_t Actor::policy_version() const { return impl_->version_; }
const ActorMetrics& Actor::metrics() const { return impl_->m_; }
std::string Actor::metrics_json() const { return impl_->metrics_json(); }
Prompt Actor::build_task_prompt(const tasks::Task& task, uint64_t seed) { return impl_->build_task_prompt(task, seed); }
const std::vector<ProbeRecord>& Actor::probe_records() const { return impl_->probe_done_; }
std::vector<std::string> Actor::probe_task_names() const { return impl_->probe_task_names(); }

void Actor::Impl::log_group(const GroupJob& job, std::size_t completions,
                            const std::map<std::string, uint64_t>& codes) {
  const Prompt& prompt = job.prompt;
  if (opts_.metrics_dir.empty() || groups_log_failed_) return;
  const std::string path = opts_.metrics_dir + "/groups-" + std::to_string(opts_.id) + ".jsonl";
  if (!groups_log_) {
    ::mkdir(opts_.metrics_dir.c_str(), 0755);  // the launcher's run folder has it; a bare actor may not
    groups_log_ = std::fopen(path.c_str(), "a");
    if (!groups_log_) {
      groups_log_failed_ = true;
      log_error("actor ", opts_.id, ": cannot open ", path, " (", std::strerror(errno),
                "); sampling goes on without the per-group prompt log");
      return;
    }
  }
  uint64_t failures = 0;
  for (const auto& [code, n] : codes) failures += n;
  std::size_t prompt_tokens = prompt.tokens.size();  // turn > 1: the longest member conversation
  for (const auto& m : job.members) prompt_tokens = std::max(prompt_tokens, m.tokens.size());
  nlohmann::json j = {{"t", std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count()},
                      {"actor", opts_.id},
                      {"group", job.group_id},
                      {"task", job.task->name()},
                      {"policy_version", job.version},
                      {"prompt_tokens", prompt_tokens},
                      {"exemplars_offered", prompt.offered},
                      {"exemplars_shown", prompt.shown.size()},
                      {"exemplars_cut", prompt.truncated},
                      {"exemplars_dropped", prompt.dropped},
                      {"completions", completions},
                      {"extraction_failures", failures},
                      {"extraction_codes", codes}};
  if (opts_.turns > 1) {
    j["turn"] = job.turn;
    j["parent_group"] = job.root_group_id;
  }
  if (job.probe) j["probe"] = true;
  const std::string line = j.dump() + "\n";
  // One line per write, flushed: a killed actor loses at most the line it was writing.
  if (std::fwrite(line.data(), 1, line.size(), groups_log_) != line.size() || std::fflush(groups_log_) != 0) {
    log_error("actor ", opts_.id, ": writing ", path, " failed (", std::strerror(errno),
              "); sampling goes on without the per-group prompt log");
    std::fclose(groups_log_);
    groups_log_ = nullptr;
    groups_log_failed_ = true;
  }
}

bool Actor::Impl::refresh_weights() {
  auto& snaps = shm_.snapshots();
  const auto info = snaps.latest();
  // Newer than what is loaded (-1: the initial weights) and not already found bad.
  if (info.version < 0 || info.version <= loaded_version_ || info.version == rejected_version_) return false;
  AddSeconds timed{m_.weights_s};
  const auto got = snaps.read(blob_, 1);
  if (got.version < 0) return false;
  const std::string ctx = "snapshot v" + std::to_string(got.version) + " (" + shm_.run() + ")";
  const auto check = check_weights_blob(policy_.model, blob_.data(), got.bytes, ctx);
  if (!check.ok) {
    if (rejected_version_ != got.version)
      log_error("actor ", opts_.id, ": ignoring ", ctx, ": ", check.error, "; keeping the weights of version ",
                version_);
    rejected_version_ = got.version;
    ++m_.snapshots_rejected;
    shm_.control().add_counter(slot_, ctr::kActorSnapshotRejects, 1);
    return false;
  }
  {
    policy::GpuShare::Scope share(&gpu_share_);  // the host-to-device copy is GPU work too
    load_weights_blob(policy_.model, blob_.data(), got.bytes, ctx);
  }
  version_ = got.version;
  loaded_version_ = got.version;
  m_.policy_version = version_;
  ++m_.snapshots_loaded;
  shm_.control().add_counter(slot_, ctr::kActorSnapshotLoads, 1);
  log_info("actor ", opts_.id, ": loaded policy snapshot v", version_, " (", got.bytes, " bytes)");
  return true;
}

Prompt Actor::Impl::build_task_prompt(const tasks::Task& task, uint64_t seed) {
  auto it = info_.find(task.name());
  if (it == info_.end()) it = info_.emplace(task.name(), task_info(task, opts_.backend)).first;
  std::vector<ExemplarIn> ex;
  if (opts_.mode == PromptMode::contrastive && opts_.exemplars > 0) {
    for (const auto& e : shm_.kernels().exemplars(task.name(), static_cast<std::size_t>(opts_.exemplars), seed))
      ex.push_back({e.speedup, e.policy_version, "ok", e.source});
    if (ex.empty()) {
      ++m_.no_exemplar_prompts;
      if (warned_empty_.insert(task.name()).second)
        log_info("actor ", opts_.id, ": task ", task.name(),
                 " has no kernel in the database yet: no-exemplar prompt (logged once per task)");
    }
  }
  PromptOptions po;
  po.mode = opts_.mode;
  po.max_tokens = static_cast<std::size_t>(opts_.context_tokens - opts_.max_new_tokens);
  po.min_exemplar_tokens = static_cast<std::size_t>(opts_.min_exemplar_tokens);
  po.marker = opts_.extract.marker;
  po.abi = abi_;
  po.chat = policy::ChatTemplate::for_model(opts_.policy_dir, opts_.chat_vars);
  return build_prompt(tpl_, policy_.codec, it->second, ex, po);
}

// A next turn goes before a new task.
std::optional<Actor::Impl::GroupJob> Actor::Impl::next_job() {
  if (followups_.empty()) return next_group();
  GroupJob job = std::move(followups_.front());
  followups_.pop_front();
  job.version = version_;
  return job;
}

std::optional<Actor::Impl::GroupJob> Actor::Impl::next_group() {
  // Task and prompt.
  if (picks_ % static_cast<uint64_t>(opts_.stats_refresh_every) == 0) {
    for (const auto& t : tasks_) {
      auto best = shm_.kernels().best(t->name());
      sched_->update(t->name(), TaskStats{best.has_value(), best ? best->speedup : 0.0});
    }
  }
  ++picks_;
  const tasks::Task* task = nullptr;
  for (int tries = 0; tries < 64 && !task; ++tries) {
    const auto& cand = tasks_[sched_->next()];
    if (!unusable_.count(cand->name())) task = cand.get();
  }
  if (!task) {
    if (unusable_.size() >= tasks_.size()) throw Error("actor: every task was left out (see the log lines above)");
    return std::nullopt;
  }
  ++counter_;
  GroupJob job;
  job.task = task;
  job.group_id = fresh_id(opts_.id, counter_);
  job.version = version_;
  try {
    job.prompt = build_task_prompt(*task, opts_.seed ^ job.group_id);
  } catch (const Error& e) {
    log_error("actor ", opts_.id, ": ", e.what(), "; task ", task->name(), " is left out of the schedule");
    unusable_.insert(task->name());
    return std::nullopt;
  }
  m_.prompt_tokens += job.prompt.tokens.size();
  if (job.prompt.truncated) ++m_.prompts_truncated;
  m_.exemplars_dropped += job.prompt.dropped;
  return job;
}

policy::SamplingParams Actor::Impl::sampling_params(uint64_t group_id) {
  policy::SamplingParams sp = sampling_params_of(opts_, policy_.eos_ids, opts_.seed ^ group_id);
  sp.valid_vocab = policy_.valid_vocab;
  sp.gpu_share = &gpu_share_;
  return sp;
}

// Room where the sink puts candidates (this node's queue, or the head's kf:candidates) for
// `groups` groups (one slot each when the actor scores extraction failures itself, else G),
// capped at its capacity.
bool Actor::Impl::queue_has_room(uint64_t groups) {
  const auto G = static_cast<uint64_t>(opts_.group_size);
  const uint64_t need = (opts_.score_extraction_failures ? 1 : G) * groups;
  const auto room = sink_->room();
  return room.free_slots >= std::min<uint64_t>(need, room.capacity);
}

bool Actor::Impl::keep_going() {
  auto& ctl = shm_.control();
  const auto st = ctl.state();
  if (stopping() || st == replay::RunState::stopped || st == replay::RunState::draining) return false;
  ctl.heartbeat(slot_);
  poll_turns();  // held groups whose results came in go to the learner meanwhile
  return true;
}

void Actor::Impl::count_sampling(double sampled_s) {
  auto& ctl = shm_.control();
  m_.sample_s += sampled_s;
  ctl.add_counter(slot_, replay::ControlBlock::kWorkMs, static_cast<uint64_t>(sampled_s * 1e3));
  ctl.add_counter(slot_, replay::ControlBlock::kGpuWaitMs,
                  static_cast<uint64_t>((gpu_share_.wait_seconds() - m_.gpu_wait_s) * 1e3));
  m_.gpu_wait_s = gpu_share_.wait_seconds();
}

StepResult Actor::Impl::step() {
  AddSeconds elapsed{m_.elapsed_s};  // every return counts
  auto& ctl = shm_.control();
  ctl.heartbeat(slot_);
  if (engine_) return step_engine();
  refresh_weights();
  poll_turns();
  if (opts_.wait_for_snapshot && m_.snapshots_loaded == 0) {
    AddSeconds idle{m_.idle_s};
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    return StepResult::no_task;
  }
  if (probe_due()) return run_probe();
  std::optional<GroupJob> job = next_job();
  if (!job) return StepResult::no_task;

  // Back-pressure: wait for room for the whole group before spending time sampling. Held
  // groups are read meanwhile: the learner takes each one as soon as its results are in.
  while (!queue_has_room(1)) {
    if (!keep_going()) return StepResult::stopped;
    AddSeconds waited{m_.backpressure_s};
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }

  // Sample.
  const auto sp = sampling_params(job->group_id);
  const auto s0 = Clock::now();
  auto samples = job->turn > 1 ? sample_members(*job)
                               : rollout_group(policy_.model, policy_.codec, job->prompt.tokens, opts_.group_size, sp,
                                               policy_.valid_vocab, opts_.extract, opts_.shared_prefill);
  const double sampled_s = secs(s0, Clock::now());
  count_sampling(sampled_s);
  if (job->turn > 1) m_.followup_sample_s += sampled_s;
  return finish_group(std::move(*job), std::move(samples));
}

StepResult Actor::Impl::step_engine() {
  // Weights change only while no group is in flight: a newer snapshot stops new groups
  // until the engine drains, then loads.
  const auto latest = shm_.snapshots().latest();
  const bool snapshot_waiting =
      latest.version >= 0 && latest.version > loaded_version_ && latest.version != rejected_version_;
  if (engine_->idle()) refresh_weights();
  poll_turns();
  // The probe samples through rollout_group (its fixed seed), so only while nothing decodes.
  if (engine_->idle() && probe_due() && !(opts_.wait_for_snapshot && m_.snapshots_loaded == 0)) return run_probe();
  const bool may_add =
      !(opts_.wait_for_snapshot && m_.snapshots_loaded == 0) && !(snapshot_waiting && !engine_->idle());
  // Top up: enough sequences to fill max_sequences, plus one group waiting to join as rows
  // end. Sequences, not groups: a later turn's group holds only the members that went on.
  const auto G = static_cast<uint64_t>(opts_.group_size);
  const uint64_t want = static_cast<uint64_t>(opts_.engine_max_sequences) + G;
  auto sequences = [&]() {
    uint64_t n = 0;
    for (const auto& [id, j] : in_flight_) n += j.turn > 1 ? j.members_pending : G;
    return n;
  };
  while (may_add && sequences() < want && !stopping()) {
    if (!queue_has_room(in_flight_.size() + 1)) {
      if (!in_flight_.empty()) break;  // the groups in flight make progress meanwhile
      if (!keep_going()) return StepResult::stopped;
      AddSeconds waited{m_.backpressure_s};
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      continue;
    }
    std::optional<GroupJob> job = next_job();
    if (!job) break;
    if (job->turn > 1) {  // one request per member: each has its own conversation
      const uint64_t gid = job->group_id;
      job->completions.assign(job->members.size(), policy::Completion{});
      job->members_pending = job->members.size();
      try {
        for (std::size_t i = 0; i < job->members.size(); ++i) {
          policy::EngineRequest mr;
          mr.id = splitmix(gid ^ (0xC0FFEEULL + i));
          mr.prompt = job->members[i].tokens;
          mr.n = 1;
          mr.sampling = sampling_params(gid ^ splitmix(uint64_t(i) + 1));
          engine_->submit(std::move(mr));
          member_requests_[splitmix(gid ^ (0xC0FFEEULL + i))] = {gid, i};
        }
      } catch (const Error& e) {
        // Requests already submitted finish and are ignored (no longer in member_requests_).
        for (auto it = member_requests_.begin(); it != member_requests_.end();)
          it = it->second.first == gid ? member_requests_.erase(it) : std::next(it);
        log_error("actor ", opts_.id, ": turn ", job->turn, " of task ", job->task->name(), " not sampled (", e.what(),
                  "); its ", job->members.size(), " conversation(s) end here");
        m_.turn_members_too_long += job->members.size();
        continue;
      }
      in_flight_.emplace(gid, std::move(*job));
      continue;
    }
    policy::EngineRequest r;
    r.id = job->group_id;
    r.prompt = job->prompt.tokens;
    r.n = opts_.group_size;
    r.sampling = sampling_params(job->group_id);
    try {
      engine_->submit(std::move(r));
    } catch (const Error& e) {
      log_error("actor ", opts_.id, ": ", e.what(), "; task ", job->task->name(), " is left out of the schedule");
      unusable_.insert(job->task->name());
      continue;
    }
    in_flight_.emplace(job->group_id, std::move(*job));
  }
  if (in_flight_.empty()) {
    if (stopping()) return StepResult::stopped;
    AddSeconds idle{m_.idle_s};
    std::this_thread::sleep_for(std::chrono::milliseconds(opts_.wait_for_snapshot ? 50 : 1));
    return StepResult::no_task;
  }

  const auto s0 = Clock::now();
  auto done = engine_->step();
  count_sampling(secs(s0, Clock::now()));
  StepResult res = StepResult::no_task;
  for (auto& r : done) {
    if (auto mr = member_requests_.find(r.id); mr != member_requests_.end()) {  // a member of a later turn
      const auto [gid, idx] = mr->second;
      member_requests_.erase(mr);
      auto it = in_flight_.find(gid);
      if (it == in_flight_.end() || r.completions.empty()) continue;
      it->second.completions[idx] = std::move(r.completions[0]);
      if (--it->second.members_pending > 0) continue;
      auto job = std::move(it->second);
      in_flight_.erase(it);
      auto samples = rollout_samples(policy_.codec, std::move(job.completions), opts_.extract);
      const auto got = finish_group(std::move(job), std::move(samples));
      if (res == StepResult::no_task || got != StepResult::pushed) res = got;
      continue;
    }
    auto it = in_flight_.find(r.id);
    if (it == in_flight_.end()) continue;
    auto job = std::move(it->second);
    in_flight_.erase(it);
    auto samples = rollout_samples(policy_.codec, std::move(r.completions), opts_.extract);
    const auto got = finish_group(std::move(job), std::move(samples));
    if (res == StepResult::no_task || got != StepResult::pushed) res = got;
  }
  return res;
}

StepResult Actor::Impl::finish_group(GroupJob job, std::vector<RolloutSample> samples) {
  auto& ctl = shm_.control();
  const tasks::Task* task = job.task;
  const uint64_t group_id = job.group_id;
  const int64_t version = job.version;
  const Prompt& prompt = job.prompt;
  const int64_t t_sampled = mono_ns();

  // Extract and build the candidates; the extraction failures the actor scores itself go
  // with the group as known results, the rest to the evaluators.
  replay::GroupPublish pub;
  auto& cands = pub.candidates;
  cands.resize(samples.size());
  std::map<std::string, uint64_t> group_codes;  // this group's extraction failures, by code
  uint64_t tokens = 0, failures = 0;
  for (std::size_t i = 0; i < samples.size(); ++i) {
    auto& c = cands[i];
    const auto& comp = samples[i].completion;
    c.id = splitmix(group_id ^ (uint64_t(i) + 1) * 0x9E3779B97F4A7C15ULL);
    c.task = task->name();
    c.group_id = group_id;
    c.index_in_group = static_cast<uint32_t>(i);
    c.policy_version = version;
    c.prompt_tokens = job.turn > 1 ? job.members[i].tokens : prompt.tokens;
    c.turn = static_cast<uint32_t>(job.turn);
    c.turns = job.probe ? 1u : static_cast<uint32_t>(opts_.turns);
    c.probe = job.probe;
    c.parent_group_id = job.turn > 1 ? job.root_group_id : 0;
    c.parent_index = job.turn > 1 ? job.members[i].parent_index : static_cast<uint32_t>(i);
    c.completion_tokens = comp.tokens;
    c.behaviour_logprobs = comp.logprobs;
    c.actor_id = opts_.id;
    c.t_sampled_ns = t_sampled;
    tokens += comp.tokens.size();
    ++m_.finish_reasons[comp.finish_reason];
    auto& ex = samples[i].kernel;
    if (ex.ok) {
      c.source = std::move(ex.source);
      continue;
    }
    c.extraction_error = ex.error;
    ++failures;
    ++m_.extraction_failures;
    ++m_.extraction_codes[ex.code];
    ++group_codes[ex.code];
    if (!opts_.score_extraction_failures) continue;  // an evaluator scores it (compile_error)
    replay::Result r;
    r.candidate_id = c.id;
    r.group_id = c.group_id;
    r.index_in_group = c.index_in_group;
    r.verdict = replay::Verdict::compile_error;
    r.reason = c.extraction_error;
    r.reward = opts_.extraction_failure_reward;
    r.evaluator_id = -1 - opts_.id;  // scored by an actor
    r.t_scored_ns = mono_ns();
    pub.known.push_back(std::move(r));
  }
  const std::size_t n = cands.size();
  const std::size_t to_score = n - pub.known.size();  // members handed to the evaluators
  m_.completion_tokens += tokens;
  m_.candidates += n;
  ctl.add_counter(slot_, ctr::kActorTokens, tokens);
  ctl.add_counter(slot_, ctr::kActorExtractFail, failures);

  pub.deadline = std::chrono::duration_cast<replay::Timeout>(std::chrono::duration<double>(opts_.group_deadline_s));
  // Members that may answer again. A conversation holds at least its prompt and its answer
  // (the feedback comes on top), so a member whose prompt and answer already fill the
  // context budget ends here: known now, not after its result. A group none of whose members
  // can go on is not held: the learner takes it as soon as it is scored.
  std::vector<bool> may_go_on(samples.size(), false);
  uint64_t too_long = 0;
  const std::size_t budget = static_cast<std::size_t>(opts_.context_tokens - opts_.max_new_tokens);
  if (!job.probe && job.turn < opts_.turns) {
    for (std::size_t i = 0; i < samples.size(); ++i) {
      const auto& comp = samples[i].completion;
      const std::size_t answer =
          comp.tokens.size() - (comp.finish_reason == "eos" && !comp.tokens.empty() ? std::size_t(1) : 0);
      const std::size_t conv = (job.turn > 1 ? job.members[i].tokens.size() : prompt.tokens.size()) + answer;
      may_go_on[i] = conv < budget;
      if (!may_go_on[i]) ++too_long;
    }
  }
  // The next turn reads the results before the learner takes them; so does a probe.
  pub.hold = job.probe || std::find(may_go_on.begin(), may_go_on.end(), true) != may_go_on.end();

  // Publish: the group (the candidates' one home) with its known results, then the members to
  // score go to the evaluators; publish() waits while the replay buffer (up to 5 s) or the
  // evaluators' queue is full, calling keep_going() between tries. Time in keep_going() is
  // turn_s (poll_turns), not push_wait_s.
  double kept_going_s = 0;
  std::size_t unqueued = 0;
  // A probe round stays open while one of its groups is published: keep_going() may read the
  // round's earlier groups meanwhile, and the round ends only once every group is read.
  if (job.probe) ++probe_rounds_[version].pending;
  auto outcome = replay::PublishOutcome::full;
  const auto p0 = Clock::now();
  try {
    outcome = sink_->publish(
        pub, std::chrono::seconds(5),
        [&] {
          AddSeconds timed{kept_going_s};
          return keep_going();
        },
        &unqueued);
  } catch (const Error& e) {
    log_error("actor ", opts_.id, ": group for task ", task->name(), " not opened (", e.what(),
              "); dropped, the actor goes on");
  }
  m_.push_wait_s += std::max(0.0, secs(p0, Clock::now()) - kept_going_s);
  if (outcome == replay::PublishOutcome::full) {
    ++m_.groups_dropped;
    ctl.add_counter(slot_, ctr::kActorGroupsDropped, 1);
    log_warn("actor ", opts_.id, ": no room to publish for 5 s (", sink_->where(), "), group for task ", task->name(),
             " dropped");
    if (job.probe) {
      auto& round = probe_rounds_[version];
      --round.pending;
      ++round.rec.lost_groups;
    }
    return StepResult::dropped;
  }
  ++m_.groups;
  ctl.add_counter(slot_, ctr::kActorGroups, 1);
  log_group(job, n, group_codes);
  if (job.turn > 1) ++m_.followup_groups;
  if (too_long) {
    m_.turn_members_too_long += too_long;
    log_info("actor ", opts_.id, ": group ", group_id, " (task ", task->name(), ", turn ", job.turn, "): ", too_long,
             " of ", samples.size(), " member(s) end here, their prompt and answer filling the context budget (",
             "actors.prompt.context_tokens - actors.sampling.max_new_tokens = ", budget, ")",
             pub.hold ? "" : "; the group is not held, the learner takes it once scored");
  }
  if (job.probe) {
    probe_groups_[group_id] = {version, task->name()};
    probe_since_[group_id] = Clock::now();
  } else if (pub.hold) {
    Awaiting aw;
    aw.job = job;
    aw.may_go_on = may_go_on;
    for (const auto& s : samples) aw.answers.push_back(s.text);
    aw.since = Clock::now();
    awaiting_.emplace(group_id, std::move(aw));
  }
  // The members handed over; the rest (the actor or the run stopped while the evaluators'
  // queue was full) the sink counted lost.
  const std::size_t pushed =
      outcome == replay::PublishOutcome::stopped ? to_score - std::min(unqueued, to_score) : to_score;
  const int64_t lag = std::max<int64_t>(0, shm_.snapshots().latest().version - version);
  m_.pushed += pushed;
  if (pushed > 0) {
    m_.lag_sum += static_cast<double>(lag) * static_cast<double>(pushed);
    m_.lag_max = std::max(m_.lag_max, lag);
  }
  ctl.add_counter(slot_, ctr::kActorPushed, pushed);
  ctl.add_counter(slot_, ctr::kActorLagSum, static_cast<uint64_t>(lag) * pushed);
  if (outcome == replay::PublishOutcome::stopped) {
    log_info("actor ", opts_.id, ": stopping while group ", group_id, " (task ", task->name(), ") waited for room in ",
             sink_->where(), ": ", unqueued, " of its ", to_score, " candidate(s) not handed over, counted lost");
    return StepResult::stopped;
  }
  return StepResult::pushed;
}

std::string Actor::Impl::metrics_json() const {
  nlohmann::json j;
  j["actor"] = opts_.id;
  j["policy_version"] = version_;
  j["groups"] = m_.groups;
  j["candidates"] = m_.candidates;
  j["pushed"] = m_.pushed;
  j["extraction_failures"] = m_.extraction_failures;
  j["extraction_codes"] = m_.extraction_codes;
  j["finish_reasons"] = m_.finish_reasons;
  j["completion_tokens"] = m_.completion_tokens;
  j["samples_per_s"] = m_.elapsed_s > 0 ? double(m_.candidates) / m_.elapsed_s : 0.0;
  j["tokens_per_s"] = m_.sample_s > 0 ? double(m_.completion_tokens) / m_.sample_s : 0.0;
  j["policy_lag_mean"] = m_.pushed ? m_.lag_sum / double(m_.pushed) : 0.0;
  j["policy_lag_max"] = m_.lag_max;
  // The time split of step() (ActorMetrics).
  j["elapsed_s"] = m_.elapsed_s;
  j["sample_s"] = m_.sample_s;
  j["gpu_wait_s"] = m_.gpu_wait_s;
  j["backpressure_s"] = m_.backpressure_s;
  j["push_wait_s"] = m_.push_wait_s;
  j["weights_s"] = m_.weights_s;
  j["idle_s"] = m_.idle_s;
  j["turn_s"] = m_.turn_s;
  j["other_s"] = std::max(
      0.0, m_.elapsed_s - m_.sample_s - m_.backpressure_s - m_.push_wait_s - m_.weights_s - m_.idle_s - m_.turn_s);
  j["snapshots_loaded"] = m_.snapshots_loaded;
  j["snapshots_rejected"] = m_.snapshots_rejected;
  j["groups_dropped"] = m_.groups_dropped;
  j["prompts_truncated"] = m_.prompts_truncated;
  j["exemplars_dropped"] = m_.exemplars_dropped;
  j["no_exemplar_prompts"] = m_.no_exemplar_prompts;
  if (opts_.turns > 1) {
    j["turns"] = opts_.turns;
    j["followup_groups"] = m_.followup_groups;
    j["followup_members"] = m_.followup_members;
    j["turn_groups_awaiting"] = awaiting_.size();
    j["turn_groups_lost"] = m_.turn_groups_lost;
    j["turn_groups_timed_out"] = m_.turn_groups_timed_out;
    j["turn_members_unscored"] = m_.turn_members_unscored;
    j["turn_members_too_long"] = m_.turn_members_too_long;
    j["turn_groups_read"] = m_.turn_groups_read;
    j["turn_hold_mean_s"] = m_.turn_groups_read ? m_.turn_hold_s / double(m_.turn_groups_read) : 0.0;
    j["turn_release_delay_mean_s"] = m_.turn_groups_read ? m_.turn_release_delay_s / double(m_.turn_groups_read) : 0.0;
    if (!engine_) j["followup_sample_s"] = m_.followup_sample_s;
  }
  if (engine_) {
    const auto es = engine_->stats();
    j["engine_groups_in_flight"] = in_flight_.size();
    j["engine_kv_blocks_peak"] = es.blocks_peak_used;
    j["engine_kv_blocks_total"] = es.blocks_total;
    j["engine_mean_batch"] = es.decode_steps ? double(es.decode_rows) / double(es.decode_steps) : 0.0;
  }
  return j.dump();
}

void Actor::Impl::run(const std::atomic<bool>* stop) {
  ext_stop_ = stop;  // the waits inside step() (back-pressure, full queue) watch it too
  auto& ctl = shm_.control();
  if (ctl.state() == replay::RunState::starting) {
    log_info("actor ", opts_.id, ": waiting for the run to start");
    while (ctl.state() == replay::RunState::starting && !stop_ && !(stop && *stop)) {
      ctl.heartbeat(slot_);
      ctl.wait_state_change(replay::RunState::starting, std::chrono::milliseconds(200));
    }
  }
  // metrics/actor-<id>.jsonl and TensorBoard events, step = groups sampled so far.
  std::unique_ptr<MetricsWriter> metrics;
  if (!opts_.metrics_dir.empty()) {
    try {
      metrics = std::make_unique<MetricsWriter>(opts_.metrics_dir, "actor-" + std::to_string(opts_.id));
    } catch (const Error& e) {
      log_error("actor ", opts_.id, ": cannot write metrics (", e.what(), "); sampling goes on without them");
    }
  }
  auto last = Clock::now();
  auto report = [&]() {
    const std::string j = metrics_json();
    log_info("actor ", opts_.id, ": ", j);
    if (!metrics) return;
    std::vector<std::pair<std::string, double>> scalars;
    nlohmann::json extra = nlohmann::json::object();
    const auto fields = nlohmann::json::parse(j);  // named: items() refers into it
    for (const auto& [k, v] : fields.items()) {
      if (v.is_number())
        scalars.emplace_back(k, v.get<double>());
      else
        extra[k] = v;
    }
    try {
      metrics->write(static_cast<int64_t>(m_.groups), scalars, extra);
    } catch (const Error& e) {
      log_error("actor ", opts_.id, ": metrics write failed (", e.what(), "); sampling goes on without metrics");
      metrics.reset();
    }
  };
  while (!stop_ && !(stop && *stop)) {
    const auto st = ctl.state();
    if (st == replay::RunState::stopped || st == replay::RunState::draining) {
      log_info("actor ", opts_.id, ": run is ", replay::run_state_name(st), ", stopping");
      break;
    }
    if (opts_.max_groups > 0 && m_.groups >= static_cast<uint64_t>(opts_.max_groups)) break;
    if (stop) stop_ = stop_ || stop->load();
    step();
    if (secs(last, Clock::now()) >= opts_.metrics_every_s) {
      report();
      last = Clock::now();
    }
  }
  if (!in_flight_.empty())
    log_info("actor ", opts_.id, ": stopping with ", in_flight_.size(),
             " group(s) still decoding in the engine; they were never opened in replay and are dropped");
  release_held();
  report();
}

void Actor::Impl::release_held() {
  if (!probe_groups_.empty()) {
    std::size_t released = 0;
    for (const auto& [id, vt] : probe_groups_) {
      try {
        if (sink_->release(id)) ++released;
      } catch (const Error& e) {
        log_error("actor ", opts_.id, ": releasing probe group ", id, " failed (", e.what(),
                  "); it waits for its deadline");
      }
    }
    log_info("actor ", opts_.id, ": stopping with ", probe_groups_.size(), " probe group(s) not yet scored (", released,
             " released); their probe is not recorded");
    probe_groups_.clear();
    probe_since_.clear();
  }
  if (awaiting_.empty() && followups_.empty()) return;
  std::size_t released = 0;
  for (const auto& [id, aw] : awaiting_) {
    try {
      if (sink_->release(id)) ++released;
    } catch (const Error& e) {
      log_error("actor ", opts_.id, ": releasing held group ", id, " failed (", e.what(),
                "); it waits for its deadline");
    }
  }
  log_info("actor ", opts_.id, ": stopping with ", awaiting_.size(), " group(s) awaiting results for a next turn (",
           released, " released to the learner) and ", followups_.size(),
           " next-turn group(s) not sampled; those conversations end here");
  awaiting_.clear();
  followups_.clear();
}

void Actor::Impl::poll_turns() {
  poll_probes();
  if (awaiting_.empty()) return;
  AddSeconds timed{m_.turn_s};
  for (auto it = awaiting_.begin(); it != awaiting_.end();) {
    const uint64_t id = it->first;
    Awaiting& aw = it->second;
    replay::ScoredGroup g;
    replay::GroupPeek st = replay::GroupPeek::absent;
    try {
      st = sink_->peek(id, &g, /*release=*/true);
    } catch (const Error& e) {
      log_error("actor ", opts_.id, ": reading held group ", id, " failed (", e.what(),
                "); its conversations end here");
      st = replay::GroupPeek::absent;
    }
    if (st == replay::GroupPeek::pending) {
      // The replay deadline makes a group ready; this guards against one that never is.
      if (secs(aw.since, Clock::now()) > opts_.group_deadline_s + 60) {
        ++m_.turn_groups_timed_out;
        sink_->release(id);
        log_warn("actor ", opts_.id, ": group ", id, " (task ", aw.job.task->name(), ", turn ", aw.job.turn,
                 ") not scored within actors.group_deadline_s + 60 s; released, its conversations end here");
        it = awaiting_.erase(it);
      } else {
        ++it;
      }
      continue;
    }
    if (st == replay::GroupPeek::absent) {
      ++m_.turn_groups_lost;
      log_warn("actor ", opts_.id, ": group ", id, " (task ", aw.job.task->name(), ", turn ", aw.job.turn,
               ") left the replay buffer before its results were read (evicted, stale or past its deadline); ",
               aw.answers.size(), " conversation(s) end here");
      it = awaiting_.erase(it);
      continue;
    }
    ++m_.turn_groups_read;
    m_.turn_hold_s += secs(aw.since, Clock::now());
    int64_t last_scored = 0;  // when its last result came in: from then on only the actor held it
    for (std::size_t i = 0; i < g.results.size(); ++i)
      if (!(i < g.missing.size() && g.missing[i])) last_scored = std::max(last_scored, g.results[i].t_scored_ns);
    if (last_scored > 0 && !g.deadline_hit)
      m_.turn_release_delay_s += static_cast<double>(std::max<int64_t>(0, mono_ns() - last_scored)) * 1e-9;
    build_followups(aw, g);
    it = awaiting_.erase(it);
  }
}

void Actor::Impl::build_followups(Awaiting& aw, const replay::ScoredGroup& g) {
  const GroupJob& prev = aw.job;
  GroupJob next;
  next.task = prev.task;
  ++counter_;
  next.group_id = fresh_id(opts_.id, counter_);
  next.prompt = prev.prompt;
  next.prompt.tokens.clear();  // each member has its own
  next.prompt.text.clear();
  next.turn = prev.turn + 1;
  next.root_group_id = prev.turn == 1 ? prev.group_id : prev.root_group_id;
  const auto chat = policy::ChatTemplate::for_model(opts_.policy_dir, opts_.chat_vars);
  const auto info = info_.find(prev.task->name());
  const std::string lang = info != info_.end() ? info->second.lang : std::string("cpp");
  const std::size_t budget = static_cast<std::size_t>(opts_.context_tokens - opts_.max_new_tokens);
  uint64_t unscored = 0, too_long = 0;
  for (std::size_t i = 0; i < g.candidates.size() && i < aw.answers.size(); ++i) {
    if (i < aw.may_go_on.size() && !aw.may_go_on[i]) continue;  // counted when the group was opened
    if (i >= g.results.size() || (i < g.missing.size() && g.missing[i]) ||
        g.results[i].cause == replay::Cause::environment) {
      ++unscored;
      continue;
    }
    Member m;
    m.parent_index = prev.turn == 1 ? static_cast<uint32_t>(i) : prev.members[i].parent_index;
    m.conv = prev.turn == 1 ? first_turn(prev.prompt) : prev.members[i].conv;
    const std::string fb = feedback_.feedback(g.candidates[i], g.results[i], next.turn, static_cast<int>(opts_.turns),
                                              lang, opts_.extract.marker);
    add_turn(m.conv, feedback_, aw.answers[i], fb);
    try {
      m.tokens = policy_.codec.encode(render_conversation(m.conv, chat.get()));
    } catch (const Error& e) {
      log_error("actor ", opts_.id, ": turn ", next.turn, " prompt of task ", prev.task->name(),
                " cannot be rendered (", e.what(), "); that conversation ends here");
      ++too_long;
      continue;
    }
    if (m.tokens.size() > budget) {
      ++too_long;
      continue;
    }
    m_.prompt_tokens += m.tokens.size();
    next.members.push_back(std::move(m));
  }
  m_.turn_members_unscored += unscored;
  m_.turn_members_too_long += too_long;
  m_.followup_members += next.members.size();
  if (unscored || too_long)
    log_info("actor ", opts_.id, ": group ", prev.group_id, " (task ", prev.task->name(), ", turn ", prev.turn,
             "): ", next.members.size(), " member(s) go on to turn ", next.turn, ", ", unscored,
             " without a result (lost, past the deadline, or an environment verdict), ", too_long,
             " over the context budget (actors.prompt.context_tokens - actors.sampling.max_new_tokens = ", budget, ")");
  if (!next.members.empty()) followups_.push_back(std::move(next));
}

// The members decode together, one row each (their conversations differ: left-padded to the
// longest, as policy::Sampler batches prompts), not one after another.
std::vector<RolloutSample> Actor::Impl::sample_members(const GroupJob& job) {
  std::vector<std::vector<int32_t>> prompts;
  prompts.reserve(job.members.size());
  for (const auto& m : job.members) prompts.push_back(m.tokens);
  auto sp = sampling_params(job.group_id);
  sp.shared_prefill = false;
  policy::Sampler sampler(policy_.model, nullptr);
  return rollout_samples(policy_.codec, sampler.generate(prompts, sp), opts_.extract);
}

// --- Learning-curve probe (actors.probe; docs/metrics.md "Learning curve").

namespace {
uint64_t name_hash(const std::string& s) {  // FNV-1a: a task's name to a seed, stable across builds
  uint64_t h = 0xcbf29ce484222325ULL;
  for (unsigned char ch : s) h = (h ^ ch) * 0x100000001b3ULL;
  return h;
}
constexpr std::size_t kDefaultProbeTasks = 4;
}  // namespace

std::vector<std::string> Actor::Impl::probe_task_names() const {
  std::vector<std::string> out;
  for (const auto& p : probe_) out.push_back(p.task->name());
  return out;
}

void Actor::Impl::setup_probe() {
  if (opts_.probe_every <= 0 || opts_.id != 0) return;
  std::vector<std::string> names = opts_.probe_tasks;
  if (names.empty()) {
    for (const auto& t : tasks_) names.push_back(t->name());
    std::sort(names.begin(), names.end());
    if (names.size() > kDefaultProbeTasks) names.resize(kDefaultProbeTasks);
  }
  for (const auto& name : names) {
    ProbeTask pt;
    for (const auto& t : tasks_)
      if (t->name() == name) pt.task = t.get();
    if (!pt.task) {  // not in the schedule (a held-out task, say): loaded for the probe alone
      const std::string dir = opts_.tasks_dir + "/" + name;
      try {
        pt.owned = tasks::Task::load(dir);
      } catch (const Error& e) {
        throw Error("actors.probe.tasks: task '" + name + "' cannot be loaded from " + opts_.tasks_dir + ": " +
                    e.what());
      }
      if (!pt.owned->has_backend(opts_.backend))
        throw Error("actors.probe.tasks: task '" + name + "' has no " + tasks::backend_name(opts_.backend) +
                    " artifact (import it with --backends)");
      pt.task = pt.owned.get();
    }
    pt.seed = splitmix(opts_.seed ^ name_hash(name) ^ 0x9B0BE5EEDULL);
    probe_.push_back(std::move(pt));
  }
  // Prompts fixed by an earlier incarnation of this actor (a restart) are kept.
  if (!opts_.metrics_dir.empty()) {
    const std::string path = opts_.metrics_dir + "/probe-prompts.json";
    std::ifstream in(path);
    if (in) {
      try {
        const auto j = nlohmann::json::parse(in);
        for (auto& pt : probe_) {
          const auto it = j.find(pt.task->name());
          if (it == j.end()) continue;
          pt.prompt.tokens = it->at("tokens").get<std::vector<int32_t>>();
          pt.prompt.text = it->value("text", std::string());
          pt.prompt.mode = opts_.mode;
        }
      } catch (const std::exception& e) {
        log_warn("actor ", opts_.id, ": ", path, " is not a probe prompt file (", e.what(),
                 "); the probe prompts are built again");
        for (auto& pt : probe_) pt.prompt = Prompt{};
      }
    }
  }
  std::string list;
  for (const auto& pt : probe_) list += (list.empty() ? "" : ", ") + pt.task->name();
  log_info("actor ", opts_.id, ": learning-curve probe every ", opts_.probe_every,
           " policy versions (from v0): ", opts_.probe_samples, " samples of each of ", list);
}

void Actor::Impl::save_probe_prompts() {
  if (opts_.metrics_dir.empty()) return;
  nlohmann::json j = nlohmann::json::object();
  for (const auto& pt : probe_)
    if (!pt.prompt.tokens.empty()) j[pt.task->name()] = {{"tokens", pt.prompt.tokens}, {"text", pt.prompt.text}};
  try {
    ::mkdir(opts_.metrics_dir.c_str(), 0755);
    write_file_atomic(opts_.metrics_dir + "/probe-prompts.json", j.dump());
  } catch (const Error& e) {
    log_warn("actor ", opts_.id, ": cannot save the probe prompts (", e.what(),
             "); a restarted actor builds them again");
  }
}

StepResult Actor::Impl::run_probe() {
  const int64_t v = version_;
  probe_next_ = (v / opts_.probe_every + 1) * opts_.probe_every;
  probe_rounds_[v].rec.version = v;
  // The round stays open until its last group is published: the waits in between read its
  // earlier groups (poll_probes), which must not finish it early.
  ++probe_rounds_[v].pending;
  bool built = false;
  StepResult res = StepResult::pushed;
  for (auto& pt : probe_) {
    if (pt.prompt.tokens.empty()) {
      try {
        pt.prompt = build_task_prompt(*pt.task, pt.seed);
        built = true;
      } catch (const Error& e) {
        log_error("actor ", opts_.id, ": probe task ", pt.task->name(), ": ", e.what(), "; it is not probed");
        ++probe_rounds_[v].rec.lost_groups;
        continue;
      }
    }
    // Room for the whole group first, as for any group.
    while (!queue_has_room(1)) {
      if (!keep_going()) {
        probe_rounds_.erase(v);  // an incomplete probe is not recorded
        return StepResult::stopped;
      }
      AddSeconds waited{m_.backpressure_s};
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    ++counter_;
    GroupJob job;
    job.task = pt.task;
    job.group_id = fresh_id(opts_.id, counter_);
    job.version = v;
    job.prompt = pt.prompt;
    job.probe = true;
    auto sp = sampling_params(job.group_id);
    sp.seed = pt.seed;  // the same noise for sample i at every probe
    const auto s0 = Clock::now();
    auto samples = rollout_group(policy_.model, policy_.codec, pt.prompt.tokens, opts_.probe_samples, sp,
                                 policy_.valid_vocab, opts_.extract, opts_.shared_prefill);
    count_sampling(secs(s0, Clock::now()));
    const auto got = finish_group(std::move(job), std::move(samples));
    if (got != StepResult::pushed) res = got;
    if (got == StepResult::stopped) break;
  }
  if (built) save_probe_prompts();
  // Every group read already, or none published (every task failed: the probe is recorded
  // as lost at once).
  auto it = probe_rounds_.find(v);
  if (it != probe_rounds_.end() && --it->second.pending == 0) {
    if (res != StepResult::stopped) finish_probe(it->second);
    probe_rounds_.erase(it);
  }
  return res;
}

void Actor::Impl::poll_probes() {
  for (auto it = probe_groups_.begin(); it != probe_groups_.end();) {
    const uint64_t id = it->first;
    const auto [v, task] = it->second;
    replay::ScoredGroup g;
    replay::GroupPeek st = replay::GroupPeek::absent;
    try {
      st = sink_->peek(id, &g, /*release=*/true);
    } catch (const Error& e) {
      log_error("actor ", opts_.id, ": reading probe group ", id, " failed (", e.what(), ")");
    }
    if (st == replay::GroupPeek::pending) {
      // The replay deadline makes a group ready; this guards against one that never is.
      if (secs(probe_since_[id], Clock::now()) <= opts_.group_deadline_s + 60) {
        ++it;
        continue;
      }
      sink_->release(id);
      st = replay::GroupPeek::absent;
    }
    auto rit = probe_rounds_.find(v);
    if (rit != probe_rounds_.end()) {
      ProbeRound& round = rit->second;
      if (st == replay::GroupPeek::absent) {
        ++round.rec.lost_groups;
        log_warn("actor ", opts_.id, ": probe group ", id, " (task ", task, ", v", v,
                 ") left the replay buffer before it was read; the probe of v", v, " goes on without it");
      } else {
        ProbeTally& t = round.rec.tasks[task];
        for (std::size_t i = 0; i < g.candidates.size(); ++i) {
          ++t.samples;
          if (i >= g.results.size() || (i < g.missing.size() && g.missing[i]) ||
              g.results[i].cause == replay::Cause::environment)
            continue;
          ++t.scored;
          t.reward_sum += g.results[i].reward;
          if (g.results[i].verdict == replay::Verdict::ok) ++t.ok;
        }
      }
      if (--round.pending == 0) {
        finish_probe(round);
        probe_rounds_.erase(rit);
      }
    }
    probe_since_.erase(id);
    it = probe_groups_.erase(it);
  }
}

void Actor::Impl::finish_probe(ProbeRound& round) {
  ProbeRecord& r = round.rec;
  for (const auto& [task, t] : r.tasks) {
    r.all.samples += t.samples;
    r.all.scored += t.scored;
    r.all.ok += t.ok;
    r.all.reward_sum += t.reward_sum;
  }
  probe_done_.push_back(r);
  char line[160];
  std::snprintf(line, sizeof line, "mean reward %.3f, pass rate %.1f %% (%llu of %llu samples scored, %zu tasks",
                r.reward_mean(), 100.0 * r.pass_rate(), static_cast<unsigned long long>(r.all.scored),
                static_cast<unsigned long long>(r.all.samples), r.tasks.size());
  log_info("actor ", opts_.id, ": probe of v", r.version, ": ", line,
           r.lost_groups ? ", " + std::to_string(r.lost_groups) + " group(s) lost)" : std::string(")"));
  // The launcher's status line reads it (rendezvous key "probe", <= 256 bytes).
  const std::string brief = nlohmann::json{
      {"version", r.version},
      {"reward", r.reward_mean()},
      {"pass", r.pass_rate()},
      {"scored", r.all.scored},
      {"samples",
       r.all.samples}}.dump();
  try {
    shm_.control().rendezvous_put("probe", brief.data(), brief.size());
  } catch (const Error& e) {
    log_warn("actor ", opts_.id, ": probe not published to the status line (", e.what(), ")");
  }
  if (opts_.metrics_dir.empty() || probe_metrics_failed_) return;
  try {
    if (!probe_metrics_) probe_metrics_ = std::make_unique<MetricsWriter>(opts_.metrics_dir, "probe");
    nlohmann::json per_task = nlohmann::json::object();
    for (const auto& [task, t] : r.tasks)
      per_task[task] = {{"samples", t.samples},
                        {"scored", t.scored},
                        {"ok", t.ok},
                        {"reward_mean", t.scored ? t.reward_sum / double(t.scored) : 0.0}};
    probe_metrics_->write(r.version,
                          {{"policy_version", double(r.version)},
                           {"reward_mean", r.reward_mean()},
                           {"pass_rate", r.pass_rate()},
                           {"samples", double(r.all.samples)},
                           {"scored", double(r.all.scored)},
                           {"ok", double(r.all.ok)},
                           {"lost_groups", double(r.lost_groups)}},
                          nlohmann::json{{"tasks", per_task}});
  } catch (const Error& e) {
    probe_metrics_failed_ = true;
    log_error("actor ", opts_.id, ": cannot write the probe metrics (", e.what(), "); the probe goes on without them");
  }
}

}  // namespace kf::actors
