// kf/actors/actors.h: the actors component's one public header: the process that turns
// the current policy into candidates (ARCHITECTURE.md, "actor"). Sections:
//   TextCodec              text <-> token ids
//   extract_kernel, ...    the kernel source out of one completion
//   Prompt, build_prompt   contrastive prompts from a template, fitted to a token budget
//   TaskScheduler          which task the next group is for
//   ActorOptions           every knob of an actor, from the run config
//   ActorPolicy            the actor's copy of the policy
//   rollout                G completions of one prompt, decoded and extracted
//   feedback               multi-turn refinement: the verifier's word as the next prompt
//   Actor                  the actor loop over the run's shared memory
//   optimize               inference with an exported policy (tools/optimize)
//   serial                 actor -> evaluator -> replay in one process (kf_actors_serial)
// Group sampling and the weight blob of the snapshot store stay in actors/src/.
//
#pragma once
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "kf/common/config.h"
#include "kf/policy/policy.h"
#include "kf/replay/replay.h"
#include "kf/tasks/tasks.h"

// The serial mode's evaluator side (kf_actors_serial links it; kf/evaluator/evaluator.h).
namespace kf::evaluator {
class Evaluator;
class EvaluatorService;
}  // namespace kf::evaluator
namespace kf {
class MetricsWriter;  // kf/common/metrics.h
}

namespace kf::actors {

// --- Extraction: the kernel source out of one completion.
//
// The prompt asks for exactly one fenced block whose info string carries the marker
// word (default "kernel"): ```cuda kernel ... ``` or ```cpp kernel ... ```. Other fenced
// blocks (snippets in the analysis) are allowed and ignored. What counts as a failure,
// each with a stable code so metrics can count them and the learner sees the reason:
//   no_code          no fenced block at all
//   no_marked_block  fenced blocks, but none marked (and the unmarked fallback did not apply)
//   several_blocks   more than one marked block
//   unterminated     the marked block never closes (usually: the completion hit max tokens)
//   empty_block      the marked block holds only whitespace
//   no_entry_point   no `extern "C"` definition of kf_forward(...) { ... }
//   too_large        the source exceeds max_bytes (it would not fit a queue slot / the DB)
// Fallback (allow_unmarked): with no marked block, exactly one unmarked block that
// defines kf_forward is taken. A completion that reasons first (<think> ... </think>, as
// Qwen3 does) is read after its last </think>; one whose <think> never closes is
// `unterminated`. Pure functions; any thread.

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

// True if `source` has an extern "C" kf_forward definition (a body, not just a declaration).
bool defines_entry_point(const std::string& source);

// --- TextCodec: text <-> token ids for prompts and completions, over either the policy's
// tokenizer.json (BPE) or raw bytes (id = byte value, for byte-level models such as the
// random "tiny" shape, whose vocab is 256 with id 0 as EOS).
// Immutable after construction; const methods may run on any thread.

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

// --- Contrastive prompts (CUDA-L1 stage 3), built from a template file, fitted to the
// model's context by token count.
//
// Template file (configs/prompts/contrastive.txt): sections introduced by a line
// "=== name ===", with {{placeholders}}. Lines before the first section are comments.
//   header                  {{task}} {{backend}} {{lang}} {{reference}} {{signature}} {{abi}} {{backend_notes}}
//   backend_notes_cpu/_cuda text for {{backend_notes}}
//   exemplars_intro         {{count}}
//   exemplar                {{index}} {{speedup}} {{verdict}} {{policy_version}} {{lang}} {{source}}
//   truncated               appended to a cut exemplar source: {{omitted_lines}}
//   contrastive_instruction {{lang}} {{marker}}   (analyse why faster is faster, plan, write one kernel)
//   no_exemplar_instruction {{lang}} {{marker}}   (no earlier kernels: plan, then write)
//   plain                   a whole prompt on its own (ablation): {{task}} {{reference}} {{signature}} {{abi}} {{lang}}
//   {{marker}} {{backend}} system                  optional: the system turn ({{task}} {{backend}} {{lang}} {{marker}}
//   ...)
// Unknown placeholders and missing sections are errors naming the file and section.
//
// Chat template: with PromptOptions::chat set (the model folder has a chat template), the
// text built above is the user turn, after the `system` section's text as a system turn
// when the file has one, and the prompt is the template's rendering of those turns (as
// transformers' apply_chat_template(..., add_generation_prompt=True) renders them: special
// tokens, the assistant header). Without one the prompt is the raw text (the system text
// first, when there is one).
//
// Modes: contrastive (header + exemplars + contrastive instruction; with no exemplar it
// falls back to the no-exemplar text), no_exemplars (ablation: never shows exemplars),
// plain (the `plain` section only).
//
// Fitting (token-exact): the whole prompt, chat template included, is re-encoded after every change and must be
// <= max_tokens. Over budget, the longest exemplar source is cut at a token boundary
// (then back to a line end), never below min_exemplar_tokens; below that an exemplar is
// dropped (the middle one first, so slow and fast stay side by side). If the prompt
// without exemplars is still too long, build_prompt throws kf::Error naming the task.
// Pure functions on immutable inputs; any thread.

enum class PromptMode { contrastive, no_exemplars, plain };
PromptMode parse_prompt_mode(const std::string& s, const std::string& context);  // throws kf::Error
const char* prompt_mode_name(PromptMode m);

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
std::string kf_dtype_name(c10::ScalarType t);  // "float32", "bfloat16", ...

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

// --- TaskScheduler: which task the next group is for.
//
// Policies (actors.schedule.policy):
//   uniform     every task equally often (each pick independent)
//   cycle       passes over all tasks, each in a new random order: within a pass every task
//               comes once, so any stretch of picks holds nearly the same task mix (the
//               per-minute windows of an evidence run compare like with like)
//   room        weighted toward tasks with room to improve: a task with no verified kernel
//               has room 1; one whose best kernel is s times faster than the reference has
//               room 1 / max(1, s)^alpha. Tasks tried many times without a kernel keep room 1.
//   curriculum  levels unlock in order: level L+1 opens once `unlock_fraction` of the tasks
//               of the open levels have a verified kernel; open tasks are weighted by room.
// Every task keeps a share: with probability min_share the pick is uniform over all tasks
// (locked curriculum levels included), so no task starves and none is forgotten (cycle
// needs no share: it visits every task each pass).
// The weights come from TaskStats the caller refreshes (the actor reads the KernelDb).
// Seeded and deterministic. One thread at a time.

enum class SchedulePolicy { uniform, cycle, room, curriculum };
SchedulePolicy parse_schedule_policy(const std::string& s, const std::string& context);  // throws kf::Error

struct ScheduleOptions {
  SchedulePolicy policy = SchedulePolicy::room;
  double min_share = 0.2;        // probability of a uniform pick over all tasks
  double alpha = 1.0;            // room exponent on the best speedup
  double unlock_fraction = 0.5;  // curriculum
};

struct TaskEntry {
  std::string name;
  int level = 1;
};

struct TaskStats {
  bool solved = false;      // has a verified kernel
  double best_speedup = 0;  // of the best verified kernel
};

class TaskScheduler {
 public:
  TaskScheduler(std::vector<TaskEntry> tasks, ScheduleOptions opts, uint64_t seed);
  void update(const std::string& task, const TaskStats& s);
  std::size_t next();  // index into tasks()
  const std::vector<TaskEntry>& tasks() const { return tasks_; }
  // The probability of each task on the next pick (tests, metrics).
  std::vector<double> probabilities() const;
  int open_level() const;  // curriculum: highest unlocked level

 private:
  double room(std::size_t i) const;
  std::vector<TaskEntry> tasks_;
  std::vector<TaskStats> stats_;
  ScheduleOptions opts_;
  std::mt19937_64 rng_;
  std::vector<std::size_t> pass_;  // cycle: this pass's order; pass_pos_ picks made from it
  std::size_t pass_pos_ = 0;
};

// --- ActorOptions: every knob of an actor as one plain struct, read from the run config's
// `actors:` section (plus run.seed, run.backend, tasks.*, learner.policy/init_shape/
// temperature and evaluator.reward.compile_error; keys and help in
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
  // Variables for the chat template, as JSON (actors.prompt.enable_thinking: {} or
  // {"enable_thinking": true|false}); the template decides what they do.
  std::string chat_vars;
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
  // rollout engine (policy/engine.h): several groups in flight, continuous batching over a
  // paged KV cache. engine_max_sequences 0: one group at a time through rollout_group.
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
  // multi-turn refinement: a member may revise its answer after the verifier's feedback, up
  // to `turns` answers in all (1: single turn). Each turn is its own replay group.
  int64_t turns = 1;
  // learning-curve probe (actors.probe, docs/metrics.md "Learning curve"): actor 0 samples
  // probe_samples completions of each probe task on a fixed prompt with a fixed seed at
  // policy version 0 and then every probe_every versions; never trained on. 0: off.
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

// --- The actor's copy of the policy: model, text codec, EOS ids and the sampleable vocab.
// Initial weights are the learner's (learner.policy folder, or a seeded random init of
// learner.init_shape with run.seed, which equals the learner's version 0); snapshots
// then replace them (weights_blob.h).
// One thread drives an ActorPolicy.

struct ActorPolicy {
  policy::ModelConfig config;
  policy::CausalLM model{nullptr};
  TextCodec codec = TextCodec::bytes();
  std::vector<int64_t> eos_ids;
  int64_t valid_vocab = 0;
};

// The random-init shapes the learner knows (kept equal to learner.cpp's model_shape;
// a drift shows up as snapshots rejected for a shape mismatch).
policy::ModelConfig init_shape_config(const std::string& name);

// device: "cpu", "cuda", "cuda:N". bf16 on CUDA, fp32 on CPU. A model without
// tokenizer.json must be byte-level (vocab <= 256 + padding); otherwise kf::Error.
ActorPolicy load_actor_policy(const std::string& policy_dir, const std::string& init_shape, uint64_t seed,
                              const std::string& device);
// A policy around a model the caller built (tests, serial mode); byte codec if tok is null.
ActorPolicy make_actor_policy(policy::CausalLM model, const policy::Tokenizer* tok);

// --- Multi-turn refinement (actors.turns > 1): the verifier's word on a member's answer as the
// next user turn of its conversation, and the conversation rendered as the next prompt.
//
// Feedback template file (configs/prompts/feedback.txt, PromptTemplate format): one section
// per outcome (no_code, compile_error, incorrect, failed for runtime_error / timeout /
// rejected_cheat, ok), then `revise` appended to each, and `raw_turn` ({{feedback}}): what a
// model without a chat template sees after its own answer. Placeholders: {{verdict}}
// {{reason}} {{speedup}} {{max_error}} {{lang}} {{marker}} {{turn}} {{turns}}. load() renders
// every section once, so a missing section or unknown placeholder fails at start, naming
// the file and section.
//
// Conversation: the turns so far (system?, user, assistant, user, ..., ending with a user
// turn). With the model's chat template the prompt is its rendering (the same
// apply_chat_template layout as the first prompt, multi-turn history included); without one
// it is plain text: the first prompt's text, then each answer followed by raw_turn.
// Pure functions on immutable inputs; any thread.

class FeedbackTemplate {
 public:
  static FeedbackTemplate load(const std::string& path);
  static FeedbackTemplate parse(const std::string& text, const std::string& context);
  // The next user turn for a member's answer `c` scored `r`, asking for turn `turn` of `turns`.
  std::string feedback(const replay::Candidate& c, const replay::Result& r, int turn, int turns,
                       const std::string& lang, const std::string& marker) const;
  std::string raw_turn(const std::string& feedback) const;
  const std::string& context() const { return tpl_.context(); }

 private:
  PromptTemplate tpl_;
};

struct Conversation {
  std::vector<policy::ChatMessage> messages;  // ends with a user turn
  std::string raw;                            // the plain-text rendering (no chat template)
};

// The first turn of a prompt built by build_prompt (its system and user text).
Conversation first_turn(const Prompt& p);
// Appends the member's answer and the feedback on it.
void add_turn(Conversation& conv, const FeedbackTemplate& tpl, const std::string& answer, const std::string& feedback);
// The prompt text: the chat template's rendering of the messages, or the raw text.
std::string render_conversation(const Conversation& conv, const policy::ChatTemplate* chat);

// --- One rollout: G completions of a prompt sampled as a group, each decoded to text without
// its stopping end-of-sequence token and its kernel extracted. Actors, tools/optimize and
// tools/selfsup all sample through it, so a sample means the same thing everywhere: the same
// sampling knobs (SamplingParams, top-k included), the same text and the same extraction.
// What happens next differs by caller: an actor queues the candidates for the evaluators,
// optimize and selfsup verify them in process.
// Threading: one thread; the model must not be used concurrently.

struct RolloutSample {
  policy::Completion completion;  // tokens (the stopping token included), behaviour log-probs
  std::string text;               // the completion as text, without a final end-of-sequence token
  Extraction kernel;              // the extracted kernel, or why there is none
};

std::vector<RolloutSample> rollout_group(policy::CausalLM& model, const TextCodec& codec,
                                         const std::vector<int32_t>& prompt, int64_t G,
                                         const policy::SamplingParams& sampling, int64_t valid_vocab,
                                         const ExtractOptions& extract, bool shared_prefill = true);

// The completions of one group as samples: text and extracted kernel (rollout_group's
// second half; the actor's engine path, which samples many groups at once, uses it too).
std::vector<RolloutSample> rollout_samples(const TextCodec& codec, std::vector<policy::Completion> completions,
                                           const ExtractOptions& extract);

// The text of a completion: its tokens decoded, less the end-of-sequence token that stopped
// it (not text: a byte model's would decode to a NUL).
std::string completion_text(const TextCodec& codec, const policy::Completion& c);

// --- Actor: turns the current policy into candidates (ARCHITECTURE.md, "actor").
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
// sequences running plus one group waiting; a later turn's group counts its members), runs it
// until at least one group has finished,
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
// Learning-curve probe (actors.probe.every = N > 0, actor 0 only; docs/metrics.md "Learning
// curve"): at policy version 0 and then at the first version loaded at or past each multiple
// of N, before any new group, the actor samples one group of probe_samples completions for
// each probe task. A probe task's prompt is built once (the run's prompt mode) and kept for
// the run (<metrics_dir>/probe-prompts.json keeps it across restarts), and its sampling seed
// is fixed (run.seed and the task's name): at every probe, sample i of a task draws the same
// noise, so two probes of the same weights write the same completions. Probe candidates carry
// Candidate::probe; their groups are opened held, verified like any other, read by the actor
// once scored (then released: the learner takes them and leaves them out), and each probe's
// figures (ProbeRecord) go to <metrics_dir>/probe.jsonl and to the control block's rendezvous
// key "probe" (the launcher's status line). With the rollout engine the probe runs while the
// engine is idle (new weights load only then), through rollout_group, so its seed holds.
//
// Multi-turn refinement (actors.turns = T > 1): a group whose members may revise is opened
// held (replay/group_replay.h). The held groups are polled at the start of every step() and
// while the actor waits for room in the candidate queue (before sampling, or pushing), so a
// scored group goes to the learner without waiting for the actor's next group. Once one is
// scored, every member with a result gets a follow-up: its conversation so far (the first
// prompt, its answer, the verifier's feedback from configs/prompts/feedback.txt: compiler
// lines, error figures, speedup) rendered through the chat template, or as plain text. The
// follow-ups of one group form the next turn's group (own group id; each candidate carries its
// turn, the turn-1 group id and its member index there, and its own prompt tokens), sampled
// before any new task, one completion per member, the members decoding together. A member
// whose prompt and answer already fill the context budget ends when it is sampled (a group with
// no member left to go on is not held); one without a result (lost, deadline passed), with an
// environment verdict, or whose rendered conversation does not fit ends when the group is read
// (all counted). A held group that is evicted, dropped stale or taken at its deadline ends its
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

struct ActorMetrics {
  uint64_t groups = 0, candidates = 0, pushed = 0, extraction_failures = 0;
  uint64_t completion_tokens = 0, prompt_tokens = 0;
  uint64_t snapshots_loaded = 0, snapshots_rejected = 0, groups_dropped = 0;
  uint64_t prompts_truncated = 0, exemplars_dropped = 0, no_exemplar_prompts = 0;
  int64_t policy_version = 0;
  double lag_sum = 0;
  int64_t lag_max = 0;
  // Where step()'s wall time goes (elapsed_s): sampling, waiting for queue room before
  // sampling, handing a sampled group over (replay buffer or candidate queue full),
  // loading snapshots, nothing to sample, and the multi-turn bookkeeping; the rest
  // (extraction, prompts, group log) is elapsed_s minus these.
  double sample_s = 0, backpressure_s = 0, elapsed_s = 0;
  double gpu_wait_s = 0;                             // of sample_s: waiting for the GPU while the evaluator timed
  double push_wait_s = 0;                            // a sampled group waiting for replay or queue room
  double weights_s = 0;                              // reading and loading policy snapshots
  double idle_s = 0;                                 // nothing to sample (first snapshot, no usable task, engine empty)
  double turn_s = 0;                                 // polling held groups, building follow-up prompts
  std::map<std::string, uint64_t> extraction_codes;  // failure code -> count
  std::map<std::string, uint64_t> finish_reasons;    // "eos", "loop", "length" -> completions
  // multi-turn (actors.turns > 1)
  uint64_t followup_groups = 0;        // groups of turn > 1 opened
  uint64_t followup_members = 0;       // follow-ups built (members given feedback)
  uint64_t turn_groups_lost = 0;       // held groups gone before they were read (evicted, stale)
  uint64_t turn_groups_timed_out = 0;  // held groups never ready within group_deadline_s (+60 s)
  uint64_t turn_members_unscored = 0;  // members without a result (lost, deadline) or environment verdicts
  uint64_t turn_members_too_long = 0;  // conversations over the context budget
  uint64_t turn_groups_read = 0;       // held groups whose results were read (then released to the learner)
  double turn_hold_s = 0;              // summed over those: opened -> read (the learner could not take them)
  double turn_release_delay_s = 0;     // summed over those: last result in -> read (the actor's share of the hold)
  double followup_sample_s = 0;        // of sample_s: sampling turn > 1 groups (one group at a time only)
};

enum class StepResult { pushed, dropped, stopped, no_task };

// Learning-curve probe (actors.probe): what one probe of one policy version scored, over
// its tasks and per task. A sample is scored when it has a result whose cause is the kernel
// (not lost, past the deadline, or an environment verdict); reward_mean and pass_rate (ok
// share) are over the scored samples.
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
  // The probes completed so far (every probe group read or lost), oldest first.
  const std::vector<ProbeRecord>& probe_records() const { return probe_done_; }
  // The probe tasks in order (empty: no probe).
  std::vector<std::string> probe_task_names() const;

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
  StepResult step_engine();
  StepResult finish_group(GroupJob job, std::vector<RolloutSample> samples);  // extract, open, push
  // --- learning-curve probe (actors.probe; actor 0 only)
  struct ProbeTask {
    const tasks::Task* task = nullptr;
    std::shared_ptr<const tasks::Task> owned;  // a probe task outside the schedule (held out)
    uint64_t seed = 0;                         // the fixed sampling (and exemplar) seed
    Prompt prompt;                             // fixed at the first probe (tokens empty until then)
  };
  struct ProbeRound {
    ProbeRecord rec;
    std::size_t pending = 0;  // groups opened and not read yet
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

// Loads the tasks an actor schedules: tasks.include names (a missing one is logged and
// left out) or every task of the chosen levels; tasks without `backend` and held-out
// tasks (tasks.heldout) are left out. Throws kf::Error if none remain. `strict` (the
// launcher's preflight, before anything starts): a tasks.include name that is missing,
// does not load or is held out is an error.
std::vector<std::shared_ptr<const tasks::Task>> load_actor_tasks(const ActorOptions& o, bool strict = false);

// --- Inference with an exported policy (tools/optimize, kf-optimize): the pieces the tool
// shares with its tests, so a test can build the very prompt the tool will sample from.
//
// The prompt is an actor's prompt (Actor::build_task_prompt): the same template, ABI
// header, task info, exemplars and context fitting, driven by the same ActorOptions
// (actors.prompt.*, actors.sampling.max_new_tokens). The exemplars come from a file
// instead of the run's shared memory: a saved kernel database (kernel_db.json, as a
// run writes it under kernels/ and a learner checkpoint holds it) or a folder of seed
// kernels (<dir>/<task>/<name>.cu|.cpp with optional <name>.json), loaded into a
// private KernelDb so the CUDA-L1 bucketed draw is the one the actors use.
// Pure functions (load_exemplars creates and unlinks a private shared-memory segment;
// import_task_file runs the Python importer); any thread.

// K exemplars of `task` from `path` (a kernel_db.json, a folder holding kernel_db.json
// or kernels/kernel_db.json, or a seed folder), ascending speedup. None for the task:
// an empty list. Throws kf::Error naming the file for a missing or malformed source.
std::vector<ExemplarIn> load_exemplars(const std::string& path, const std::string& task, std::size_t k, uint64_t seed);

// The prompt for `task` as an actor with options `o` and policy `policy` builds it:
// o.template_path / o.abi_header_path (empty: the tree's defaults), o.mode, o.backend,
// budget = (o.context_tokens or the model's max positions) - o.max_new_tokens, at most
// o.exemplars of `exemplars` (which must be ascending, as load_exemplars returns them).
// Throws kf::Error when the budget is not positive or the prompt cannot fit.
Prompt optimize_prompt(const ActorOptions& o, const ActorPolicy& policy, const tasks::Task& task,
                       std::vector<ExemplarIn> exemplars);

// Imports one KernelBench-format file with tasks/importer/kf_import.py (run by `python`)
// into `out_dir` for `backend`; the importer's output goes to <out_dir>/import.log.
// Returns the artifact folder (<out_dir>/<file stem>). Throws kf::Error naming the file
// and quoting the importer's last lines when it fails.
std::string import_task_file(const std::string& py_file, const std::string& out_dir, tasks::Backend backend,
                             const std::string& python);

// --- Serial mode (Sample Factory style): actor -> evaluator -> replay in one process, over
// the same shared-memory pipes a multi-process run uses, for debugging and tests.
//
//   SerialRunner serial(actor, evaluator, shm, tasks, backend);
//   serial.step();   // one actor group, then every queued candidate evaluated and joined
//
// The evaluator side is the evaluator process's own loop (kf::evaluator::EvaluatorService):
// pops candidates, verifies each, writes the Result into its replay group, inserts ok
// kernels into the KernelDb (speedup, policy version); then the replay ingests the results.
// One thread.

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
