// Actor::Impl: the actor loop's state and steps (actor.cpp), behind kf/actors/actors.h's
// Actor. Only actor.cpp and actors' tests include it.
//
// One step(): refresh weights if a newer snapshot is published -> pick a task (or the oldest
// next turn) -> contrastive prompt (K exemplars from the KernelDb, bucketed) -> wait until
// the sink has room for the group (backpressure_s) -> G completions sharing the prefill ->
// extract each kernel -> publish the group through the GroupSink (finish_group): the
// candidates, the results of the extraction failures the actor scores itself, the deadline,
// and whether the actor holds it (a next turn or a probe reads its results first).
// publish() waits while the evaluators' queue is full, calling keep_going(): heartbeats,
// stop checks and poll_turns(), so held groups reach the learner meanwhile.
//
// Rollout engine (actors.engine.max_sequences > 0): step_engine() tops the engine up with new
// groups (max_sequences sequences plus one group waiting; a later turn's group counts its
// members), runs it until a group has finished and publishes the finished ones. Weights load
// only while no group is in flight, so a group's tokens and log-probs come from one version.
//
// Multi-turn (actors.turns > 1, docs/multi-turn.md): a group with a member that may go on is
// published held; poll_turns() peeks the held groups (never blocking), and a scored one gets
// its follow-ups (build_followups) as the next turn's group, sampled before any new task.
// A member whose prompt and answer fill the context budget ends when it is sampled; one
// without a result, with an environment verdict, or whose conversation does not fit ends
// when the group is read; a group that left the replay (evicted, stale, past its deadline)
// ends its conversations. All counted in ActorMetrics and logged.
//
// Probe (actors.probe, actor 0): run_probe() samples one group per probe task at a fixed
// prompt (kept in <metrics_dir>/probe-prompts.json across restarts) and seed through
// rollout_group; the groups are published held, read by poll_probes() and released;
// finish_probe() writes probe.jsonl and the control block's "probe" rendezvous key.
//
// metrics_dir: metrics/actor-<id>.jsonl (metrics_json(), every metrics_every_s) and one line per
// published group in groups-<id>.jsonl: {"t", "actor", "group", "task", "policy_version",
// "prompt_tokens", "exemplars_offered", "exemplars_shown", "exemplars_cut", "exemplars_dropped",
// "completions", "extraction_failures", "extraction_codes", "turn", "parent_group", "probe"}
// (tools/report joins the verdicts to the prompt that produced them by "group").
//
// Threading: one thread drives it; stop_ may be set from any thread.
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
#include <utility>
#include <vector>

#include "feedback.h"
#include "kf/actors/actors.h"
#include "scheduler.h"

namespace kf {
class MetricsWriter;  // kf/common/metrics.h
}

namespace kf::actors {

struct Actor::Impl {
  Impl(ActorOptions opts, ActorPolicy policy, std::vector<std::shared_ptr<const tasks::Task>> tasks,
       replay::RunShm& shm, std::unique_ptr<replay::GroupSink> sink);
  ~Impl();

  StepResult step();
  void run(const std::atomic<bool>* stop);
  bool refresh_weights();
  std::string metrics_json() const;
  Prompt build_task_prompt(const tasks::Task& task, uint64_t seed);
  std::vector<std::string> probe_task_names() const;

  ActorOptions opts_;
  ActorPolicy policy_;
  policy::GpuShare gpu_share_;  // shared hold of a GPU the run's evaluator may be timing on
  std::vector<std::shared_ptr<const tasks::Task>> tasks_;
  replay::RunShm& shm_;                      // control block, snapshots, kernel database of this node
  std::unique_ptr<replay::GroupSink> sink_;  // where the groups go (the seam)
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
    bool probe = false;  // a probe group (actors.probe): held, single turn, Candidate::probe
  };
  // A held group whose results the next turn needs.
  struct Awaiting {
    GroupJob job;
    std::vector<std::string> answers;  // completion texts by index_in_group
    std::vector<bool> may_go_on;       // by index_in_group: prompt + answer leave room in the context
    std::chrono::steady_clock::time_point since;
  };
  FeedbackTemplate feedback_;
  std::map<uint64_t, Awaiting> awaiting_;                                 // by group id
  std::deque<GroupJob> followups_;                                        // next turns, sampled first
  std::map<uint64_t, std::pair<uint64_t, std::size_t>> member_requests_;  // engine: request -> (group, member)
  void poll_turns();                                                      // held groups -> followups_
  void release_held();  // lets the learner take the held groups; drops unsampled next turns
  void build_followups(Awaiting& aw, const replay::ScoredGroup& g);
  std::vector<RolloutSample> sample_members(const GroupJob& job);  // one completion per member
  std::unique_ptr<policy::Engine> engine_;                         // null: one group at a time
  std::map<uint64_t, GroupJob> in_flight_;                         // engine requests by group id
  std::optional<GroupJob> next_group();                            // task + prompt, or none (no usable task now)
  std::optional<GroupJob> next_job();                              // the oldest follow-up turn, else next_group()
  policy::SamplingParams sampling_params(uint64_t group_id);
  bool queue_has_room(uint64_t groups);
  // Between tries while publish() waits for the evaluators' queue (and before sampling):
  // false once the actor or the run stops; else heartbeat and poll the held groups.
  bool keep_going();
  StepResult step_engine();
  StepResult finish_group(GroupJob job, std::vector<RolloutSample> samples);  // extract, publish
  void count_sampling(double sampled_s);  // the time split and the control block's work/GPU-wait ms

  // --- learning-curve probe (actors.probe; actor 0 only)
  struct ProbeTask {
    const tasks::Task* task = nullptr;
    std::shared_ptr<const tasks::Task> owned;  // a probe task outside the schedule (held out)
    uint64_t seed = 0;                         // the fixed sampling (and exemplar) seed
    Prompt prompt;                             // fixed at the first probe (tokens empty until then)
  };
  struct ProbeRound {
    ProbeRecord rec;
    std::size_t pending = 0;  // groups published and not read yet
  };
  std::vector<ProbeTask> probe_;
  int64_t probe_next_ = 0;                                            // the next version to probe at (or past)
  std::map<int64_t, ProbeRound> probe_rounds_;                        // by version, until every group is read
  std::map<uint64_t, std::pair<int64_t, std::string>> probe_groups_;  // held group -> (version, task)
  std::map<uint64_t, std::chrono::steady_clock::time_point> probe_since_;
  std::vector<ProbeRecord> probe_done_;
  std::unique_ptr<MetricsWriter> probe_metrics_;
  bool probe_metrics_failed_ = false;
  void setup_probe();
  bool probe_due() const { return !probe_.empty() && version_ >= probe_next_; }
  StepResult run_probe();  // one group per probe task at the current version
  void poll_probes();      // read the scored probe groups; finish complete probes
  void finish_probe(ProbeRound& round);
  void save_probe_prompts();
  void log_group(const GroupJob& job, std::size_t completions, const std::map<std::string, uint64_t>& codes);
};

}  // namespace kf::actors
