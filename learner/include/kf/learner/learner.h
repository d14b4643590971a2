// kf/learner/learner.h: the learner's public header: one data-parallel rank of the trainer
// and what the launcher, benchmarks and tools need around it (docs/learner.md). Sections:
//   LearnerConfig, Communicator, SyntheticSource (tests, benchmarks), Learner,
//   checkpoints, export.
// A rank's groups come through the work seam (kf::replay::ReadyGroups, from
// kf::transport::open_ready_groups). The rest is in learner/src/.
#pragma once
#include <torch/torch.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "kf/common/config.h"
#include "kf/policy/policy.h"
#include "kf/replay/replay.h"

namespace kf::learner {

// --- LearnerConfig: every knob of the learner as one plain struct, read from the run config's
// `learner:` section (keys, defaults and help in common/src/config_schema.cpp; why each
// exists: docs/learner.md, "Configuration"). Tests and benchmarks build one directly; the
// learner never reads the YAML. Plain data; any thread.

enum class Objective { grpo, pairwise, grpo_pairwise };
enum class RatioMode { behaviour, decoupled };
enum class Aggregation { token, sequence };
enum class ScheduleKind { constant, linear, cosine };
enum class ShardMode { none, optimizer, gradients, params };

struct GrpoConfig {
  bool std_normalize = false;  // A = (r - mean) / (std + adv_eps) instead of r - mean
  double adv_eps = 1e-6;
  RatioMode ratio = RatioMode::behaviour;
  double clip_low = 0.2;              // ratio clipped to [1 - clip_low, 1 + clip_high]
  double clip_high = 0.2;             // DAPO clip-higher: 0.28
  double behaviour_weight_cap = 5.0;  // decoupled: pi_prox / pi_behaviour capped here
  double kl_coef = 0.0;               // k3 KL to the frozen reference
  Aggregation aggregation = Aggregation::token;
  bool shuffle_rewards = false;  // placebo: rewards permuted within each group (seeded)
};

struct PairwiseConfig {
  double coef = 1.0;
  double beta = 0.1;
  int64_t pairs_per_group = 4;
  double min_reward_gap = 0.0;
};

struct OptimConfig {
  double lr = 1e-6, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0.0, grad_clip = 1.0;
  bool fused_cuda = true;  // CUDA: one fused multi-tensor update; false: the per-tensor loop
};

struct ScheduleConfig {
  ScheduleKind kind = ScheduleKind::constant;
  int64_t warmup_steps = 10;
  int64_t total_steps = 1000;
  double min_lr_ratio = 0.1;
};

struct LearnerConfig {
  std::string policy;               // initial HF folder; empty: random init
  std::string init_shape = "tiny";  // "tiny" | "qwen2.5-0.5b" | path of an HF config.json, for a random init
  uint64_t seed = 0;
  int64_t steps = 0;
  Objective objective = Objective::grpo;
  int64_t groups_per_step = 8;      // over all ranks
  int64_t min_groups_per_step = 1;  // a step waits, holding what it took, for this many
  int64_t take_timeout_ms = 1000;
  int64_t max_staleness = 4;
  int64_t micro_batch_tokens = 16384;
  bool pack = true;                  // micro-batches of whole sequences back to back; false: right-padded rows
  std::string param_dtype = "auto";  // fp32 | bf16 (fp32 masters) | auto (Learner resolves it)
  double temperature = 1.0;
  std::string precision = "auto";  // auto | fp32 | bf16
  bool gradient_checkpointing = false;
  bool deterministic = false;
  GrpoConfig grpo;
  PairwiseConfig pairwise;
  OptimConfig optim;
  ScheduleConfig schedule;
  int64_t ranks = 1;
  std::string comm = "auto";  // auto | cpu | nccl
  int64_t bucket_mb = 25;
  ShardMode shard = ShardMode::none;  // ZeRO-1/2/3 (docs/learner-scale.md)
  int64_t snapshot_every = 1;
  std::string snapshot_dtype = "bf16";
  int64_t checkpoint_every = 100;
  int64_t checkpoint_keep = 3;
  int64_t recompute_min_params = 3000000000;  // layer recomputation from this size on (0: never)
  int64_t recompute_layers = -1;              // recompute the first N decoder layers (-1: all)
  int64_t kl_start_max_params = 1000000000;   // log kl_start up to this size (0: when free)
  int64_t logit_chunk_tokens = 1024;          // completion positions per chunk of the vocabulary head
  // LoRA: rank 0 trains every weight; rank > 0 freezes the base and trains adapters on
  // lora_targets only (snapshots then carry only the adapters).
  int64_t lora_rank = 0;
  double lora_alpha = 16.0;
  std::vector<std::string> lora_targets = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};

  bool uses_grpo() const { return objective != Objective::pairwise; }
  bool uses_pairwise() const { return objective != Objective::grpo; }
  bool needs_reference() const { return uses_pairwise() || (uses_grpo() && grpo.kl_coef != 0.0); }
  // Whether the steps log kl_start for a policy of `params` parameters.
  bool logs_kl_start(int64_t params) const {
    return needs_reference() || (kl_start_max_params > 0 && params <= kl_start_max_params);
  }
};

// Reads the `learner.*` keys (and run.seed). Throws kf::Error naming the key for a value
// out of range (e.g. "learner.dist.ranks: must be >= 1").
LearnerConfig learner_config_from(const kf::Config& cfg);

// --- Communicator: collectives between data-parallel ranks, the same for every backend:
// local (one rank, no-ops), shm (processes of one host; learner/src/comm.h), nccl (one rank
// per GPU). Every rank must make the same calls in the same order. A dead or stalled peer
// makes the others throw kf::Error naming the communicator, the operation and the
// rank(s) (shm: after its timeout) instead of hanging. The *_async calls may return
// before the work is done (NCCL: queued on the communicator's stream); synchronize()
// makes the caller's stream wait for everything queued.
// Threading: one thread per Communicator, except that all_reduce_async may be called from
// the autograd thread during backward while the caller waits in it.

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int world() const = 0;
  virtual std::string name() const = 0;  // "shm:kf.learn.x rank 1/4", for logs and errors
  // In place; contiguous fp32 or fp64 on the communicator's device.
  virtual void all_reduce_sum(torch::Tensor& t) = 0;
  virtual void all_reduce_async(torch::Tensor t) { all_reduce_sum(t); }
  virtual void synchronize() {}
  virtual void broadcast(torch::Tensor& t, int root) = 0;
  virtual void barrier() = 0;

  // Reduce-scatter (sum), in place. t: contiguous fp32/fp64 (shm also bf16), numel a
  // multiple of world(), seen as world() equal slices; afterwards slice rank() holds the
  // sum over ranks of that slice, the others are unspecified.
  virtual void reduce_scatter_sum(torch::Tensor& t) { all_reduce_sum(t); }
  virtual void reduce_scatter_async(torch::Tensor t) { reduce_scatter_sum(t); }
  // All-gather, in place: t (contiguous, any dtype, numel a multiple of world()) is seen as
  // world() equal slices; afterwards slice r holds what rank r had in its slice r.
  virtual void all_gather(torch::Tensor& t);
  virtual void all_gather_async(torch::Tensor t) { all_gather(t); }

  // A marker of everything queued so far (NCCL: an event on the communicator's stream);
  // wait_for(m) makes the caller's stream wait for that work only. Synchronous backends:
  // nothing to wait for.
  virtual std::shared_ptr<void> mark() { return nullptr; }
  virtual void wait_for(const std::shared_ptr<void>& m) {
    if (m) synchronize();
  }
};

std::unique_ptr<Communicator> make_local_comm();

// True when this build has NCCL (KF_HAVE_NCCL); kf-learner's NCCL communicator needs it.
bool nccl_available();

// --- SyntheticSource: a deterministic stream of scored groups for tests and benchmarks, in
// place of the run's ReadyGroups: group k of step s depends only on (seed, s, k), and rank r
// of R gets groups k with k % R == r, so R ranks together see exactly the batch one rank
// sees, and a resumed learner sees exactly the data it would have seen.
// Threading: the learner thread.

struct SyntheticConfig {
  uint64_t seed = 1;
  int64_t vocab = 256;
  int64_t group_size = 4;
  int64_t prompt_min = 4, prompt_max = 12;
  int64_t completion_min = 3, completion_max = 10;
  double behaviour_logprob = -5.5;  // about -log(vocab) for a random-init model
  double behaviour_noise = 0.2;
  int64_t equal_reward_every = 5;  // every Nth group has all-equal rewards (0: never)
  int64_t stale_every = 0;         // every Nth group is max_lag + 1 versions old (0: never)
};

class SyntheticSource : public replay::ReadyGroups {
 public:
  explicit SyntheticSource(SyntheticConfig cfg) : cfg_(cfg) {}
  std::vector<replay::ScoredGroup> take(const replay::TakeRequest& r) override;
  // Group k of step `step` (exposed for tests).
  replay::ScoredGroup make_group(int64_t step, int64_t k, int64_t version, int64_t max_lag) const;
  int64_t groups_per_step_total = 8;  // what all ranks together take per step

 private:
  SyntheticConfig cfg_;
};

// --- Learner: one data-parallel rank of the GRPO / pairwise trainer. Each step() takes
// this rank's share of groups from deps.source, drops stale ones and those without signal,
// all-reduces the batch counts (the loss is normalised over all ranks' tokens), runs
// forward/backward over token-budgeted micro-batches, clips and applies AdamW (the policy
// version becomes the step count), and publishes / checkpoints on schedule (rank 0
// writes; all ranks call). With LoRA only the adapters are trainable (optimizer,
// all-reduce, weights_checksum(), snapshots). shard: params keeps only this rank's slice
// of the weights: model() is whole only inside forward/backward, and publish_snapshot(),
// checkpoint(), weights_checksum(), named_weights() and load_checkpoint() are collective.
// A step in which no rank has usable data changes nothing and returns updated=false.
// Every rank keeps bitwise identical weights (weights_checksum()).
// Threading: one thread drives a Learner.

struct LearnerDeps {
  Communicator* comm = nullptr;                // required
  replay::ReadyGroups* source = nullptr;       // required: open_ready_groups, or a SyntheticSource
  replay::SnapshotStore* snapshots = nullptr;  // optional: where snapshots go (rank 0 publishes)
  replay::RunShm* shm = nullptr;               // optional: replay + kernel DB saved in checkpoints
  std::string checkpoint_dir;                  // optional: <run>/checkpoints
  torch::Device device = torch::kCPU;
};

// Figures of one step (metrics/learner.jsonl; docs/learner.md, "Per-step metrics").
struct StepStats {
  bool updated = false;
  int64_t step = 0;  // steps done after this one
  double loss = 0, grpo_loss = 0, pairwise_loss = 0, kl = 0, clip_fraction = 0, mean_ratio = 0;
  double grad_norm = 0, lr = 0;  // grad_norm: global L2 norm before clipping
  // k3 KL(behaviour || current policy) and the mean exact entropy, over all ranks' tokens.
  double kl_behaviour = 0, entropy = 0;
  // Completion lengths in tokens over all ranks; truncated_fraction: share of completions
  // that do not end in one of the model's eos ids (-1 when the model names none).
  double response_length_mean = 0, truncated_fraction = -1;
  int64_t response_length_max = 0;
  int64_t groups = 0, sequences = 0, tokens = 0, pairs = 0, micro_batches = 0;  // all ranks
  double seconds = 0, publish_stall_ms = 0, checkpoint_seconds = 0;
  double take_seconds = 0;      // of seconds: waiting for groups from the source
  double gpu_wait_seconds = 0;  // of seconds: waiting for the GPU while an evaluator timed
  int64_t buckets_in_backward = 0;
  double padding_fraction = 0;  // share of token slots that were padding, all ranks (0 when packed)
  double kl_start = -1;         // k3 KL(current || start policy); -1 when not computed
  // Groups this step took, all ranks (set also on steps that did not train): in all, skipped
  // for equal rewards, and probe groups (Candidate::probe), never trained on.
  int64_t groups_in = 0, skipped_equal = 0, probe_groups = 0;
};

// What the snapshot publishes cost (rank 0; learner/src/snapshot_publisher.h).
struct PublishStats {
  int64_t publishes = 0;
  double last_stall_ms = 0, max_stall_ms = 0, total_stall_ms = 0;
  double last_total_ms = 0;  // staging + copy + store write of the last finished publish
  uint64_t blob_bytes = 0;
};

// The figures of a step that trained, by name (metrics/learner.jsonl, TensorBoard).
std::vector<std::pair<std::string, double>> step_scalars(const StepStats& st);

// The architecture of a random-init model by name: "tiny" (2 layers, hidden 64, vocab
// 256: tests) or "qwen2.5-0.5b" (benchmarks). Throws kf::Error for another name.
policy::ModelConfig model_shape(const std::string& name);

class Learner {
 public:
  Learner(LearnerConfig cfg, LearnerDeps deps);
  ~Learner();
  Learner(const Learner&) = delete;
  Learner& operator=(const Learner&) = delete;

  // Continues from the newest valid checkpoint in deps.checkpoint_dir (rank 0 picks it,
  // every rank loads it); its step, or nullopt. restore_shm: also reload its replay and
  // kernel DB into the run's shared memory (false: only this process restarted).
  std::optional<int64_t> resume(bool restore_shm = true);
  // Loads a specific checkpoint folder (weights, optimizer, step, RNG, counters; replay
  // and kernel DB into deps.shm on rank 0 when restore_shm).
  void load_checkpoint(const std::string& path, bool restore_shm = true);

  StepStats step();
  std::string checkpoint();  // all ranks call; rank 0 writes; returns the path ("" on others)
  void publish_snapshot();   // rank 0 publishes the current weights as version()
  // Every weight of the model, whole, as CPU copies in name order (sharded: collective).
  std::vector<std::pair<std::string, torch::Tensor>> named_weights();
  // Bytes of parameter storage this rank holds now (shared storage counted once, plus
  // sharded-parameter slices).
  int64_t param_storage_bytes() const;

  int64_t steps_done() const { return step_; }
  int64_t version() const { return step_; }
  policy::CausalLM model() const { return model_; }
  const LearnerConfig& config() const { return cfg_; }
  uint64_t weights_checksum() const;  // xxh64 over all trainable weights, name order (sharded: collective)
  // Counts by name (steps, groups_used, dropped_stale, skipped_equal, tokens, empty_steps,
  // publishes, checkpoints, ...).
  const std::map<std::string, int64_t>& counters() const { return counters_; }
  PublishStats publish_stats() const;  // waits for the publish in flight; zeros without a store
  void set_tokenizer_json(std::string json) { tokenizer_json_ = std::move(json); }

  struct Impl;

 private:
  std::vector<std::pair<std::string, torch::Tensor>> sharded_weights_cpu(bool keep);
  LearnerConfig cfg_;
  LearnerDeps deps_;
  policy::CausalLM model_{nullptr};
  int64_t step_ = 0;
  std::map<std::string, int64_t> counters_;
  std::vector<replay::ScoredGroup> pending_;  // taken, waiting for min_groups_per_step
  std::string tokenizer_json_;
  std::unique_ptr<Impl> impl_;
};

// --- Learner checkpoints: one folder per checkpoint under <run>/checkpoints/, named
// step-<12 digits>, holding
//   model.safetensors       trainable weights (HF names)
//   optimizer.safetensors   AdamW exp_avg / exp_avg_sq per parameter
//   reference.safetensors   the frozen start policy (when the objective or kl_start needs one)
//   config.json, tokenizer.json   the policy's HF config (and tokenizer, if it has one)
//   state.json              step, version, schedule, RNG states, counters, config echo
//   replay.bin, kernel_db.json    replay contents and kernel database (rank 0, when attached)
//   MANIFEST.json           every other file's size and 64-bit hash; written last
// Atomic (temp folder, fsync, rename): a crash leaves the previous checkpoints intact. The
// newest `keep` valid ones are kept; corrupt ones never count and are set aside, never
// deleted (learner/src/checkpoint.h).
// Threading: one writer (learner rank 0); readers any thread.

using NamedTensors = std::vector<std::pair<std::string, torch::Tensor>>;

struct CheckpointData {
  int64_t step = 0;
  NamedTensors model, optimizer, reference;
  std::string state_json;
  std::string model_config_json;
  std::string tokenizer_json;  // empty: none
  // Writes extra files (replay.bin, kernel_db.json) into the temp folder; they are
  // hashed into the manifest like the rest.
  std::function<void(const std::string& dir)> extra;
};

// Writes <dir>/step-..., removes older ones beyond `keep` and stale temp folders.
// Returns the checkpoint's path. Throws kf::Error naming the file on I/O failure.
std::string write_checkpoint(const std::string& dir, const CheckpointData& data, int64_t keep);

// Throws kf::Error naming the checkpoint and the file and field that failed.
void verify_checkpoint(const std::string& path);

// Every checkpoint folder, newest first, verified; changes nothing (tools/launch --resume
// reports these before it starts anything).
struct CheckpointCheck {
  std::string path;
  int64_t step = 0;
  std::string error;  // empty: valid; else why it is unusable
};
std::vector<CheckpointCheck> check_checkpoints(const std::string& dir);

// --- Export: a learner checkpoint -> an HF-format folder that transformers loads (weights,
// config, generation config, the starting model's tokenizer files and chat template;
// docs/learner.md, "Export"). LoRA: merged weights, or with `peft` a PEFT adapter folder.
// Used by tools/export. Plain function; any thread.

struct ExportOptions {
  std::string dtype = "float32";  // "float32" or "bfloat16" weights
  double temperature = 1.0;       // generation_config.json sampling defaults
  double top_p = 1.0;
  int64_t max_new_tokens = 2048;
  // The model folder the run started from (tokenizer_config.json, chat template, special
  // tokens). Empty: the checkpoint's own copies, else the run config's learner.policy.
  std::string base_model;
  bool peft = false;  // LoRA checkpoints only: a PEFT adapter folder instead of merged weights
};

// `checkpoint` is a checkpoint folder, a run's checkpoints/ folder or a run folder (then
// the newest valid checkpoint is used). The checkpoint is verified first. Throws
// kf::Error naming the file and field. Returns the checkpoint folder used.
std::string export_checkpoint(const std::string& checkpoint, const std::string& out_dir, const ExportOptions& opt = {});

}  // namespace kf::learner
