// Actor: turns the current policy into candidates (ARCHITECTURE.md, "actor").
//
// One step(): refresh weights if a newer snapshot is published -> pick a task ->
// contrastive prompt (K exemplars from the KernelDb, bucketed) -> G completions sharing
// the prefill -> extract each kernel -> open the group in the ReplayBuffer -> push the
// candidates to the evaluators. Every candidate carries the policy version that sampled
// it, its prompt/completion tokens and behaviour log-probs.
//
// Failed extractions are candidates too (empty source, extraction_error set). With
// score_extraction_failures the actor joins their compile_error result to the group
// itself (reward: evaluator.reward.compile_error) instead of sending them through the
// candidate queue, so the learner sees the negative example without evaluator work.
//
// With actors.engine.max_sequences > 0 the actor samples through a rollout engine
// (policy/engine.h): each step() tops the engine up with new groups (up to max_sequences
// sequences running plus one group waiting), runs it until at least one group has finished,
// and pushes the finished groups. New snapshots are loaded only while no group is in
// flight (the actor stops adding groups until they finish), so a group's tokens and
// behaviour log-probs all come from the weights of the version it carries.
//
// Back-pressure: before sampling, the actor waits until the candidate queue has room
// for the group (time waited is reported); pushes then block while the queue is full.
// A group the ReplayBuffer cannot take is dropped (logged, counted), never pushed.
//
// Bad input never crashes the actor: a task missing from tasks.dir or without the
// backend is left out at start (logged); an empty KernelDb gives no-exemplar prompts
// (logged once per task); a prompt that cannot fit the context takes the task out of
// the schedule (logged); a snapshot that does not match the model is ignored (logged
// once per version) and the old weights stay.
//
// Multi-turn refinement (actors.turns = T > 1): a group whose members may revise is opened
// held (replay/group_replay.h). Each step() first polls the held groups; once one is scored,
// every member with a result gets a follow-up: its conversation so far (the first prompt, its
// answer, the verifier's feedback from configs/prompts/feedback.txt: compiler lines, error
// figures, speedup) rendered through the chat template, or as plain text. The follow-ups of
// one group form the next turn's group (own group id; each candidate carries its turn, the
// turn-1 group id and its member index there, and its own prompt tokens), sampled before any
// new task, one completion per member. A member without a result (lost, deadline passed),
// with an environment verdict, or whose conversation no longer fits the context ends there
// (counted). A held group that is evicted, dropped stale or taken at its deadline ends its
// conversations (counted, logged); polling never blocks.
//
// With metrics_dir, every opened group also gets one line in
// <metrics_dir>/groups-<id>.jsonl: {"t", "actor", "group", "task", "policy_version",
// "prompt_tokens", "exemplars_offered", "exemplars_shown", "exemplars_cut",
// "exemplars_dropped", "completions", "extraction_failures", "extraction_codes", "turn",
// "parent_group"}, so
// tools/report can join the verdicts (by "group") to the prompt that produced them: whether
// exemplars, or cut ones, change what the policy writes.
//
// Control block counters (role "actor"): 0 candidates pushed, 1 groups opened,
// 2 completion tokens, 3 extraction failures, 4 snapshots loaded, 5 snapshots rejected,
// 6 groups dropped (replay full), 7 sum of policy lag over pushed candidates.
// Threading: one thread drives an Actor; request_stop() may be called from any thread
// (or a signal handler via the flag passed to run()).
#pragma once
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "kf/actors/actor_options.h"
#include "kf/actors/actor_policy.h"
#include "kf/actors/feedback.h"
#include "kf/actors/prompt.h"
#include "kf/actors/rollout.h"
#include "kf/actors/scheduler.h"
#include "kf/policy/policy.h"
#include "kf/replay/replay.h"
#include "kf/tasks/tasks.h"

namespace kf::actors {

struct ActorMetrics {
  uint64_t groups = 0, candidates = 0, pushed = 0, extraction_failures = 0;
  uint64_t completion_tokens = 0, prompt_tokens = 0;
  uint64_t snapshots_loaded = 0, snapshots_rejected = 0, groups_dropped = 0;
  uint64_t prompts_truncated = 0, exemplars_dropped = 0, no_exemplar_prompts = 0;
  int64_t policy_version = 0;
  double lag_sum = 0;
  int64_t lag_max = 0;
  double sample_s = 0, backpressure_s = 0, elapsed_s = 0;
  double gpu_wait_s = 0;                             // of sample_s: waiting for the GPU while the evaluator timed
  std::map<std::string, uint64_t> extraction_codes;  // failure code -> count
  std::map<std::string, uint64_t> finish_reasons;    // "eos", "loop", "length" -> completions
  // multi-turn (actors.turns > 1)
  uint64_t followup_groups = 0;        // groups of turn > 1 opened
  uint64_t followup_members = 0;       // follow-ups built (members given feedback)
  uint64_t turn_groups_lost = 0;       // held groups gone before they were read (evicted, stale)
  uint64_t turn_groups_timed_out = 0;  // held groups never ready within group_deadline_s (+60 s)
  uint64_t turn_members_unscored = 0;  // members without a result (lost, deadline) or environment verdicts
  uint64_t turn_members_too_long = 0;  // conversations over the context budget
};

enum class StepResult { pushed, dropped, stopped, no_task };

class Actor {
 public:
  // `tasks`: the candidates for scheduling (load_actor_tasks). `shm` must outlive the actor.
  Actor(ActorOptions opts, ActorPolicy policy, std::vector<std::shared_ptr<const tasks::Task>> tasks,
        replay::RunShm& shm);
  ~Actor();
  Actor(const Actor&) = delete;
  Actor& operator=(const Actor&) = delete;

  StepResult step();
  // Steps until *stop, the run drains or stops, or max_groups; logs metrics periodically.
  void run(const std::atomic<bool>* stop = nullptr);
  void request_stop() { stop_ = true; }

  // Reads the newest snapshot if it is newer than the weights in use; returns true if new
  // weights were loaded. A mismatching blob is logged once per version and ignored.
  bool refresh_weights();
  int64_t policy_version() const { return version_; }
  const ActorMetrics& metrics() const { return m_; }
  std::string metrics_json() const;
  // Builds the prompt step() would for this task (tests, tools).
  Prompt build_task_prompt(const tasks::Task& task, uint64_t seed);

 private:
  ActorOptions opts_;
  ActorPolicy policy_;
  policy::GpuShare gpu_share_;  // shared hold of a GPU the run's evaluator may be timing on
  std::vector<std::shared_ptr<const tasks::Task>> tasks_;
  replay::RunShm& shm_;
  std::unique_ptr<TaskScheduler> sched_;
  PromptTemplate tpl_;
  std::string abi_;
  int64_t version_ = 0;
  int64_t loaded_version_ = -1;  // newest snapshot loaded (-1: initial weights)
  int64_t rejected_version_ = -2;
  int slot_ = -1;
  uint64_t counter_ = 0, picks_ = 0;
  std::atomic<bool> stop_{false};
  const std::atomic<bool>* ext_stop_ = nullptr;  // run()'s flag (a signal handler's)
  bool stopping() const { return stop_ || (ext_stop_ && ext_stop_->load()); }
  std::set<std::string> unusable_, warned_empty_;
  std::map<std::string, TaskInfo> info_;
  ActorMetrics m_;
  std::vector<unsigned char> blob_;
  std::FILE* groups_log_ = nullptr;  // metrics_dir/groups-<id>.jsonl, opened at the first group
  bool groups_log_failed_ = false;   // logged once; sampling goes on without the file
  // turn > 1: one member's conversation, ending with the feedback on its last answer.
  struct Member {
    uint32_t parent_index = 0;  // its index in the turn-1 group
    Conversation conv;
    std::vector<int32_t> tokens;  // the rendered conversation
  };
  // A group on its way: picked task, prompt, id and the policy version that samples it.
  struct GroupJob {
    const tasks::Task* task = nullptr;
    uint64_t group_id = 0;
    int64_t version = 0;
    Prompt prompt;  // the turn-1 prompt (at turn > 1 kept for the group log)
    int turn = 1;
    uint64_t root_group_id = 0;                   // turn > 1: the turn-1 group
    std::vector<Member> members;                  // turn > 1: one prompt per member
    std::vector<policy::Completion> completions;  // engine, turn > 1: per member as they finish
    std::size_t members_pending = 0;
  };
  // A held group whose results the next turn needs.
  struct Awaiting {
    GroupJob job;
    std::vector<std::string> answers;  // completion texts by index_in_group
    std::chrono::steady_clock::time_point since;
  };
  FeedbackTemplate feedback_;
  std::map<uint64_t, Awaiting> awaiting_;                        // by group id
  std::deque<GroupJob> followups_;                               // next turns, sampled first
  std::map<uint64_t, std::pair<uint64_t, std::size_t>> member_requests_;  // engine: request -> (group, member)
  void poll_turns();                                             // held groups -> followups_
  void release_held();  // lets the learner take the held groups; drops unsampled next turns
  void build_followups(Awaiting& aw, const replay::ScoredGroup& g);
  std::vector<RolloutSample> sample_members(const GroupJob& job);  // one completion per member
  std::unique_ptr<policy::Engine> engine_;  // null: one group at a time
  std::map<uint64_t, GroupJob> in_flight_;  // engine requests by group id
  std::optional<GroupJob> next_group();     // task + prompt, or none (no usable task now)
  policy::SamplingParams sampling_params(uint64_t group_id);
  bool queue_has_room(uint64_t groups);
  StepResult step_engine(std::chrono::steady_clock::time_point t0);
  StepResult finish_group(GroupJob job, std::vector<RolloutSample> samples);  // extract, open, push
  void log_group(const GroupJob& job, std::size_t completions, const std::map<std::string, uint64_t>& codes);
};

// Loads the tasks an actor schedules: tasks.include names (a missing one is logged and
// left out) or every task of the chosen levels; tasks without `backend` and held-out
// tasks (tasks.heldout) are left out. Throws kf::Error if none remain. `strict` (the
// launcher's preflight, before anything starts): a tasks.include name that is missing,
// does not load or is held out is an error.
std::vector<std::shared_ptr<const tasks::Task>> load_actor_tasks(const ActorOptions& o, bool strict = false);

}  // namespace kf::actors
