// kf/actors/actors.h: what other folders call of actors/, the process that turns the current
// policy into candidates (docs/actors.md): extraction, text codec, prompts, ActorOptions,
// ActorPolicy, rollout, the Actor loop (its groups go through a replay::GroupSink),
// optimize_prompt (kf-optimize), SerialRunner. Internals: actors/src/. Threading: per section.
#pragma once
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kf/common/config.h"
#include "kf/policy/policy.h"
#include "kf/replay/replay.h"
#include "kf/tasks/tasks.h"

namespace kf::evaluator {  // the serial mode's evaluator side (kf_actors_serial)
class Evaluator;
class EvaluatorService;
}  // namespace kf::evaluator

namespace kf::actors {

// --- Extraction: the kernel source out of one completion (docs/actors.md): the
// one fenced block whose info string carries the marker word (```cuda kernel ... ```).
// Failure codes (metrics; carried as "extract: <code>: <detail>"): no_code, no_marked_block,
// several_blocks, unterminated, empty_block, no_entry_point, too_large. A completion that
// reasons first is read after its last </think>. Pure functions; any thread.

struct ExtractOptions {
  std::string marker = "kernel";  // a word of the fence's info string
  bool allow_unmarked = true;
  std::size_t max_bytes = 64 * 1024;
};

struct Extraction {
  bool ok = false;
  std::string source;  // the block's contents (ok only)
  std::string code;    // failure code (see above); empty when ok
  std::string error;   // "extract: <code>: <detail>", what the Candidate carries
};

Extraction extract_kernel(const std::string& completion, const ExtractOptions& opts = {});

// --- TextCodec: text <-> token ids, over the policy's tokenizer.json (BPE) or raw bytes (id =
// byte value: byte-level models such as "tiny", vocab 256, id 0 EOS). Immutable; any thread.

class TextCodec {
 public:
  static TextCodec bytes();
  static TextCodec bpe(policy::Tokenizer tok);

  std::vector<int32_t> encode(const std::string& text) const;
  std::string decode(const std::vector<int32_t>& ids) const;
  std::size_t count(const std::string& text) const { return encode(text).size(); }
  bool is_bytes() const { return !tok_; }
  const policy::Tokenizer* tokenizer() const { return tok_ ? &*tok_ : nullptr; }

 private:
  std::optional<policy::Tokenizer> tok_;
};

// --- Contrastive prompts (CUDA-L1 stage 3) from a template file ("=== section ===" with
// {{placeholders}}), fitted token-exactly to the context, chat template applied when
// PromptOptions::chat is set: docs/actors.md, "Prompt template". Unknown placeholders,
// missing sections and a prompt that cannot fit even without exemplars throw kf::Error
// naming the file / task. Pure functions on immutable inputs; any thread.

enum class PromptMode { contrastive, no_exemplars, plain };

class PromptTemplate {
 public:
  static PromptTemplate load(const std::string& path);
  static PromptTemplate parse(const std::string& text, const std::string& context);
  bool has(const std::string& section) const;
  const std::string& section(const std::string& name) const;  // throws kf::Error naming the file
  // Substitutes {{key}} from `vars`; an unknown key throws naming the file and section.
  std::string render(const std::string& section_name,
                     const std::vector<std::pair<std::string, std::string>>& vars) const;
  const std::string& context() const { return context_; }

 private:
  std::string context_;
  std::vector<std::pair<std::string, std::string>> sections_;
};

// What a prompt says about the task: name, backend, the Python reference and the kernel's
// argument list in ABI order with shapes and dtypes.
struct TaskInfo {
  std::string name;
  std::string backend;    // "cpu" / "cuda"
  std::string lang;       // fence language: "cpp" / "cuda"
  std::string reference;  // Python source
  std::string signature;  // in[i] / out[i] lines
};
TaskInfo task_info(const tasks::Task& task, tasks::Backend b);

// The ABI header for {{abi}}, comments dropped (the contract is stated in the template).
std::string compact_abi(const std::string& kernel_h);

struct ExemplarIn {
  double speedup = 0;
  int64_t policy_version = -1;
  std::string verdict = "ok";
  std::string source;
};

struct PromptOptions {
  PromptMode mode = PromptMode::contrastive;
  std::size_t max_tokens = 4096;
  std::size_t min_exemplar_tokens = 64;
  std::string marker = "kernel";
  std::string abi;  // text for {{abi}}
  // The model folder's chat template (policy::ChatTemplate::for_model); null: raw text.
  std::shared_ptr<const policy::ChatTemplate> chat;
};

struct ShownExemplar {
  double speedup = 0;
  int64_t policy_version = -1;
  bool truncated = false;
};

struct Prompt {
  std::string text;             // what the policy is shown (chat template applied)
  std::vector<int32_t> tokens;  // text's tokens
  std::string system, user;     // the turns before the chat template (system: "" if none)
  PromptMode mode = PromptMode::contrastive;
  std::vector<ShownExemplar> shown;  // ascending speedup, as in the text
  std::size_t offered = 0;           // exemplars given
  std::size_t dropped = 0;           // dropped to fit
  std::size_t truncated = 0;         // shown but cut
};

// `exemplars` in the order to show (KernelDb::exemplars returns ascending speedup).
Prompt build_prompt(const PromptTemplate& tpl, const TextCodec& codec, const TaskInfo& task,
                    const std::vector<ExemplarIn>& exemplars, const PromptOptions& opts);

// --- Which task the next group is for (actors.schedule.*; TaskScheduler in src/scheduler.h):
// uniform, cycle (passes in random order), room (toward tasks with room to improve),
// curriculum (levels unlock in order); a min_share of the picks stays uniform.
enum class SchedulePolicy { uniform, cycle, room, curriculum };

struct ScheduleOptions {
  SchedulePolicy policy = SchedulePolicy::room;
  double min_share = 0.2;        // probability of a uniform pick over all tasks
  double alpha = 1.0;            // room exponent on the best speedup
  double unlock_fraction = 0.5;  // curriculum
};

// --- ActorOptions: every knob of an actor, from the run config (actors.*, run.seed/backend,
// tasks.*, learner.policy/init_shape/temperature, evaluator.reward.compile_error; keys in
// common/src/config_schema.cpp). Tests build one directly. Plain data; any thread.

struct ActorOptions {
  int id = 0;
  uint64_t seed = 0;
  std::string device = "cpu";                    // "cpu", "cuda", "cuda:N"
  tasks::Backend backend = tasks::Backend::CPU;  // the backend kernels are written for
  // tasks
  std::string tasks_dir = "build/tasks";
  std::vector<int64_t> levels = {1, 2, 3};
  std::vector<std::string> include;
  std::vector<std::string> heldout;  // never scheduled (tasks.heldout, read when the options are made)
  // policy (the learner's initial weights; snapshots replace them)
  std::string policy_dir;  // HF folder; empty: random init of init_shape
  std::string chat_vars;   // chat template variables, JSON (actors.prompt.enable_thinking)
  std::string init_shape = "tiny";
  // prompts
  PromptMode mode = PromptMode::contrastive;
  std::string template_path;    // empty: configs/prompts/contrastive.txt of the source tree
  std::string abi_header_path;  // empty: the tree's evaluator/include/kf/kernel.h
  std::string feedback_path;    // empty: configs/prompts/feedback.txt of the source tree (turns > 1)
  int64_t exemplars = 4;        // K
  int64_t context_tokens = 0;   // 0: the model's max_position_embeddings
  int64_t min_exemplar_tokens = 64;
  // sampling
  int64_t group_size = 8;  // G
  double temperature = 1.0;
  double top_p = 1.0;
  int64_t top_k = 0;
  int64_t max_new_tokens = 2048;
  int64_t loop_repeats = 4;  // loop stop (policy::SamplingParams); 0: off
  int64_t loop_max_period = 128;
  int64_t loop_min_span = 64;
  bool shared_prefill = true;
  // rollout engine (policy/engine.h); 0: one group at a time through rollout_group
  int64_t engine_max_sequences = 0;
  int64_t engine_kv_budget_mb = 1024;
  int64_t engine_block_size = 16;
  int64_t engine_check_every = 8;
  bool engine_cuda_graph = true;
  // scheduling, extraction
  ScheduleOptions schedule;
  int64_t stats_refresh_every = 16;  // picks between KernelDb reads for the scheduler
  ExtractOptions extract;
  bool score_extraction_failures = true;  // the actor joins their results itself
  double extraction_failure_reward = -3.0;
  int64_t turns = 1;  // answers per member, the verifier's feedback between them (1: single turn)
  // learning-curve probe (actor 0): probe_samples completions per probe task, fixed prompt and
  // seed, at version 0 and every probe_every versions; never trained on. 0: off.
  int64_t probe_every = 0;
  std::vector<std::string> probe_tasks;  // empty: the first 4 of the actor's tasks by name
  int64_t probe_samples = 8;
  // flow
  double group_deadline_s = 600;
  bool wait_for_snapshot = false;  // sample only after the first snapshot arrives
  double metrics_every_s = 10;
  int64_t max_groups = 0;   // stop after this many groups (0: until the run stops)
  std::string metrics_dir;  // metrics/actor-<id>.jsonl + TensorBoard events here; empty: none
};

// Throws kf::Error naming the file and key for an out-of-range value.
ActorOptions actor_options(const Config& cfg, int actor_id);

// Where the source tree's defaults are (template, ABI header): relative paths are tried
// against the working directory, then $KF_SOURCE_DIR, then the tree this was built from.
std::string resolve_tree_path(const std::string& path);

// --- The actor's copy of the policy: model, codec, EOS ids, sampleable vocab.
// Initial weights are the learner's version 0 (learner.policy, or learner.init_shape seeded
// with run.seed); snapshots replace them. One thread drives an ActorPolicy.

struct ActorPolicy {
  policy::ModelConfig config;
  policy::CausalLM model{nullptr};
  TextCodec codec = TextCodec::bytes();
  std::vector<int64_t> eos_ids;
  int64_t valid_vocab = 0;
};

// The random-init shapes the learner knows (a drift shows up as snapshots rejected).
policy::ModelConfig init_shape_config(const std::string& name);

// device: "cpu", "cuda", "cuda:N". bf16 on CUDA, fp32 on CPU. A model without
// tokenizer.json must be byte-level (vocab <= 256 + padding); otherwise kf::Error.
ActorPolicy load_actor_policy(const std::string& policy_dir, const std::string& init_shape, uint64_t seed,
                              const std::string& device);
// A policy around a model the caller built (tests, serial mode); byte codec if tok is null.
ActorPolicy make_actor_policy(policy::CausalLM model, const policy::Tokenizer* tok);

// --- One rollout: G completions of a prompt sampled as a group, each decoded to text without
// its stopping EOS token and its kernel extracted. Actors, tools/optimize and tools/selfsup
// all sample through it, so a sample means the same thing everywhere.
// Threading: one thread; the model must not be used concurrently.

struct RolloutSample {
  policy::Completion completion;  // tokens (the stopping token included), behaviour log-probs
  std::string text;               // the completion as text, without a final end-of-sequence token
  Extraction kernel;              // the extracted kernel, or why there is none
};

// actors.sampling.* (same names in ActorOptions, kf-optimize's and stage 2's options) as
// SamplingParams, in one place; callers add valid_vocab and gpu_share.
template <class Knobs>
policy::SamplingParams sampling_params_of(const Knobs& o, std::vector<int64_t> eos_ids, uint64_t seed) {
  policy::SamplingParams sp;
  sp.temperature = o.temperature;
  sp.top_p = o.top_p;
  sp.top_k = o.top_k;
  sp.max_new_tokens = o.max_new_tokens;
  sp.loop_repeats = o.loop_repeats;
  sp.loop_max_period = o.loop_max_period;
  sp.loop_min_span = o.loop_min_span;
  sp.eos_ids = std::move(eos_ids);
  sp.seed = seed;
  return sp;
}

std::vector<RolloutSample> rollout_group(policy::CausalLM& model, const TextCodec& codec,
                                         const std::vector<int32_t>& prompt, int64_t G,
                                         const policy::SamplingParams& sampling, int64_t valid_vocab,
                                         const ExtractOptions& extract, bool shared_prefill = true);

// The completions of one group as samples (rollout_group's second half; the engine path's too).
std::vector<RolloutSample> rollout_samples(const TextCodec& codec, std::vector<policy::Completion> completions,
                                           const ExtractOptions& extract);

// A completion's tokens decoded, less the EOS token that stopped it (a byte model's is a NUL).
std::string completion_text(const TextCodec& codec, const policy::Completion& c);

// --- Actor: turns the current policy into candidates (actors/src/actor_impl.h).
// step(): snapshot -> task -> prompt -> room -> G samples -> extraction -> one
// GroupSink::publish (docs/actors.md, "One step"). No room for 5 s: dropped, counted.
// Bad input (missing task, prompt too long, mismatching snapshot) is logged, never fatal.
// Counters: replay::counter::kActor*. One thread drives an Actor; request_stop() from any.

struct ActorMetrics {
  uint64_t groups = 0, candidates = 0, pushed = 0, extraction_failures = 0;
  uint64_t completion_tokens = 0, prompt_tokens = 0;
  uint64_t snapshots_loaded = 0, snapshots_rejected = 0, groups_dropped = 0;
  uint64_t prompts_truncated = 0, exemplars_dropped = 0, no_exemplar_prompts = 0;
  int64_t policy_version = 0;
  double lag_sum = 0;
  int64_t lag_max = 0;
  // Where step()'s wall time (elapsed_s) goes; the rest (extraction, prompts) is "other_s".
  double sample_s = 0, backpressure_s = 0, elapsed_s = 0;
  double gpu_wait_s = 0;                             // of sample_s: waiting for the GPU while the evaluator timed
  double push_wait_s = 0;                            // publish(): a sampled group waiting for replay or queue room
  double weights_s = 0;                              // reading and loading policy snapshots
  double idle_s = 0;                                 // nothing to sample (first snapshot, no usable task, engine empty)
  double turn_s = 0;                                 // polling held groups, building follow-up prompts
  std::map<std::string, uint64_t> extraction_codes;  // failure code -> count
  std::map<std::string, uint64_t> finish_reasons;    // "eos", "loop", "length" -> completions
  // multi-turn (actors.turns > 1)
  uint64_t followup_groups = 0;        // groups of turn > 1 published
  uint64_t followup_members = 0;       // members given feedback
  uint64_t turn_groups_lost = 0;       // held groups gone before they were read
  uint64_t turn_groups_timed_out = 0;  // not ready within group_deadline_s + 60 s
  uint64_t turn_members_unscored = 0;  // no result (lost, deadline) or an environment verdict
  uint64_t turn_members_too_long = 0;  // conversations over the context budget
  uint64_t turn_groups_read = 0;       // held groups read (then released to the learner)
  double turn_hold_s = 0;              // summed over those: published -> read
  double turn_release_delay_s = 0;     // summed over those: last result in -> read
  double followup_sample_s = 0;        // of sample_s: turn > 1 groups (no engine)
};

enum class StepResult { pushed, dropped, stopped, no_task };

// Learning-curve probe: what one probe of one policy version scored, over its tasks and per
// task. Scored: a result caused by the kernel (not lost, late or environment); reward_mean
// and pass_rate (ok share) are over the scored samples.
struct ProbeTally {
  uint64_t samples = 0, scored = 0, ok = 0;
  double reward_sum = 0;
};
struct ProbeRecord {
  int64_t version = 0;
  ProbeTally all;
  uint64_t lost_groups = 0;  // probe groups gone before the actor read them (evicted, dropped)
  std::map<std::string, ProbeTally> tasks;
  double reward_mean() const { return all.scored ? all.reward_sum / double(all.scored) : 0.0; }
  double pass_rate() const { return all.scored ? double(all.ok) / double(all.scored) : 0.0; }
};

class Actor {
 public:
  // `tasks`: the candidates for scheduling (load_actor_tasks). `shm`: this node's run (control
  // block, snapshots, kernel database); it must outlive the actor. `sink`: where the groups
  // go (kf::transport::open_groups).
  Actor(ActorOptions opts, ActorPolicy policy, std::vector<std::shared_ptr<const tasks::Task>> tasks,
        replay::RunShm& shm, std::unique_ptr<replay::GroupSink> sink);
  // The groups go to `shm` itself (replay::shm_groups): one node, serial mode, tests.
  Actor(ActorOptions opts, ActorPolicy policy, std::vector<std::shared_ptr<const tasks::Task>> tasks,
        replay::RunShm& shm);
  ~Actor();
  Actor(const Actor&) = delete;
  Actor& operator=(const Actor&) = delete;

  StepResult step();
  // Steps until *stop, the run drains or stops, or max_groups; logs metrics periodically.
  void run(const std::atomic<bool>* stop = nullptr);
  void request_stop();

  // Reads the newest snapshot if it is newer than the weights in use; returns true if new
  // weights were loaded. A mismatching blob is logged once per version and ignored.
  bool refresh_weights();
  int64_t policy_version() const;
  const ActorMetrics& metrics() const;
  std::string metrics_json() const;
  // Builds the prompt step() would for this task (tests, tools).
  Prompt build_task_prompt(const tasks::Task& task, uint64_t seed);
  // The probes completed so far (every probe group read or lost), oldest first.
  const std::vector<ProbeRecord>& probe_records() const;
  // The probe tasks in order (empty: no probe).
  std::vector<std::string> probe_task_names() const;

  struct Impl;  // actors/src/actor_impl.h

 private:
  std::unique_ptr<Impl> impl_;
};

// The tasks an actor schedules: tasks.include (a missing one is logged, left out) or every
// task of tasks.levels, less those without the backend and tasks.heldout. Throws kf::Error
// if none remain; `strict` (the launcher's preflight): a bad tasks.include name throws too.
std::vector<std::shared_ptr<const tasks::Task>> load_actor_tasks(const ActorOptions& o, bool strict = false);

// --- tools/optimize (kf-optimize): the prompt for `task` as an actor with options `o` and
// `policy` builds it, with at most o.exemplars of `exemplars` (ascending speedup). Throws
// kf::Error when the budget is not positive or the prompt cannot fit. Any thread.
Prompt optimize_prompt(const ActorOptions& o, const ActorPolicy& policy, const tasks::Task& task,
                       std::vector<ExemplarIn> exemplars);

// --- Serial mode (Sample Factory style): actor -> evaluator -> replay in one process, over
// the run's shared memory; step() = one actor group, then every queued candidate evaluated
// by the evaluator process's own loop (EvaluatorService). The actor must publish to `shm`
// (Actor's constructor without a sink). One thread.

struct SerialStats {
  uint64_t groups = 0, evaluated = 0, ok = 0, kernels_inserted = 0, results_joined = 0;
};

class SerialRunner {
 public:
  SerialRunner(Actor& actor, evaluator::Evaluator& ev, replay::RunShm& shm,
               std::vector<std::shared_ptr<const tasks::Task>> tasks, tasks::Backend backend,
               const std::string& verdict_log = "");  // ServiceOptions::verdict_log
  ~SerialRunner();
  StepResult step();               // actor.step() then evaluate_pending()
  std::size_t evaluate_pending();  // drains the candidate queue; returns how many evaluated
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
