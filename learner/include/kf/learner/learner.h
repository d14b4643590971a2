// kf/learner/learner.h: the learner component's one public header: one data-parallel rank
// of the trainer and what the launcher and tools need around it (ARCHITECTURE.md,
// "learner"). Sections:
//   LearnerConfig          every knob of the learner, from the run config
//   Communicator           all-reduce and friends between ranks (NCCL, shm, single)
//   GroupSource            where a rank gets its scored groups
//   SnapshotPublisher      policy weights to the actors' snapshot store
//   Learner                one rank: pull groups, step, publish, checkpoint
//   checkpoints, export    learner checkpoints and HF export
// Batching, losses, the optimizer and gradient buckets stay in learner/src/.
//
#pragma once
#include <torch/torch.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "kf/common/config.h"
#include "kf/policy/policy.h"
#include "kf/replay/replay.h"

namespace kf::learner {

// --- LearnerConfig: every knob of the learner as one plain struct, read from the run config's
// `learner:` section (keys, defaults and help in common/src/config_schema.cpp).
// Why a struct: tests and benchmarks build one directly; the learner never reads the YAML.
// Plain data; any thread.

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
  // Placebo: permute the rewards within each group (seeded by run seed, step and group id)
  // before advantages are taken. The update then has the same size and noise as a real one
  // and no signal: the control arm of a learning experiment.
  bool shuffle_rewards = false;
};

struct PairwiseConfig {
  double coef = 1.0;
  double beta = 0.1;
  int64_t pairs_per_group = 4;
  double min_reward_gap = 0.0;
};

struct OptimConfig {
  double lr = 1e-6, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0.0, grad_clip = 1.0;
  // CUDA: the update as one fused multi-tensor kernel and the gradient norm by
  // _foreach_norm (the per-tensor loop made the optimizer 14 % of a 1.5B step). false:
  // the per-tensor loop, the CPU's path always (tests compare the two).
  bool fused_cuda = true;
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
  int64_t groups_per_step = 8;  // over all ranks
  // A step waits (holding what it took) until every rank has its share of this many
  // groups; 1: step with whatever the take returned. A slow evaluator otherwise makes
  // steps of one group of G samples: the noisiest GRPO estimate there is.
  int64_t min_groups_per_step = 1;
  int64_t take_timeout_ms = 1000;
  int64_t max_staleness = 4;
  int64_t micro_batch_tokens = 16384;
  // Packed sequences: each micro-batch is one row of whole sequences back to back (no
  // padding); false: rows right-padded to the micro-batch's longest sequence.
  bool pack = true;
  // Trained weights' dtype (full fine-tuning): "fp32", "bf16" (the optimizer keeps an fp32
  // master copy), or "auto": bf16 on CUDA when shard != none, else fp32 (Learner resolves it).
  std::string param_dtype = "auto";
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
  // Sharded training state (docs/learner-scale.md "Sharded state"): none; optimizer (fp32
  // master weights and Adam moments split over the ranks, ZeRO-1); gradients (and the
  // gradients too, ZeRO-2); params (and the weights themselves between uses, ZeRO-3:
  // each layer's weights all-gathered before its forward and backward, freed after).
  ShardMode shard = ShardMode::none;
  int64_t snapshot_every = 1;
  std::string snapshot_dtype = "bf16";
  int64_t checkpoint_every = 100;
  int64_t checkpoint_keep = 3;
  // Activation recomputation is on for models of at least this many parameters even when
  // gradient_checkpointing is false (0: never automatically).
  int64_t recompute_min_params = 3000000000;
  // With recomputation on, recompute only the first N decoder layers and keep the others'
  // activations (-1: every layer). Fewer recomputed layers: faster steps, more memory.
  int64_t recompute_layers = -1;
  // kl_start (KL to the start policy, docs/learner.md): computed when the step takes the
  // reference log-probs anyway (kl_coef, pairwise) or the policy has at most this many
  // parameters (one more no-grad forward per micro-batch; without LoRA a frozen copy of
  // the start weights too). 0: only when it comes free.
  int64_t kl_start_max_params = 1000000000;
  // Completion positions per chunk of the vocabulary projection + log-softmax.
  int64_t logit_chunk_tokens = 1024;
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

}  // namespace kf::learner

// --- Communicator: what data-parallel learner ranks need from each other. All-reduce (sum)
// of flat fp32/fp64 buffers, reduce-scatter and all-gather (sharded training state),
// broadcast and barrier, identical for every backend:
//  - local: one rank, every call a no-op (serial mode);
//  - shm:   ranks are processes of one host sharing a POSIX shared-memory segment; a
//           chunked reduce-scatter + all-gather, each element summed in rank order, so
//           every rank gets the same bits (CI and CPU-only runs);
//  - nccl:  one rank per GPU; rank 0 makes the unique id and hands it over through a
//           Rendezvous (the run's control block, or a file on a shared filesystem).
// Every rank must make the same calls in the same order (as with NCCL). A peer that
// dies or stops calling makes the others throw kf::Error naming the communicator, the
// operation and the rank(s) after `timeout` (shm), instead of hanging.
//
// all_reduce_async() may return before the reduction is done (NCCL: queued on the
// communicator's stream after the caller's stream reaches this point); synchronize()
// makes the caller's stream wait for everything queued. For shm and local it is
// synchronous. Threading: one thread per Communicator, except that all_reduce_async may
// be called from the autograd thread during backward while the caller waits in it.
namespace kf::replay {
class ControlBlock;
}

namespace kf::learner {

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

  // Reduce-scatter (sum), in place. t: contiguous fp32/fp64 (shm also bf16, summed in
  // fp32), numel a multiple of world(), seen as world() equal slices. Afterwards slice
  // rank() of t holds the sum over ranks of that slice; the other slices are unspecified.
  // shm sums each element in rank order exactly as all_reduce_sum does, so the owned
  // slice is bitwise what an all-reduce would have left there.
  // The defaults (all-reduce; one broadcast per rank) are correct for any backend.
  virtual void reduce_scatter_sum(torch::Tensor& t) { all_reduce_sum(t); }
  virtual void reduce_scatter_async(torch::Tensor t) { reduce_scatter_sum(t); }
  // All-gather, in place: t (contiguous, any dtype, numel a multiple of world()) is seen as
  // world() equal slices; afterwards slice r holds what rank r had in its slice r.
  virtual void all_gather(torch::Tensor& t);
  virtual void all_gather_async(torch::Tensor t) { all_gather(t); }

  // A marker of everything queued so far (NCCL: an event recorded on the communicator's
  // stream); wait_for(m) makes the caller's stream wait for that work only, not for what
  // was queued after it (synchronize() waits for all). Synchronous backends: nothing to wait for.
  virtual std::shared_ptr<void> mark() { return nullptr; }
  virtual void wait_for(const std::shared_ptr<void>& m) {
    if (m) synchronize();
  }
};

// Hand-over of small blobs (the NCCL unique id) from rank 0 to the others.
class Rendezvous {
 public:
  virtual ~Rendezvous() = default;
  virtual void put(const std::string& key, const std::string& bytes) = 0;
  // Waits up to timeout; throws kf::Error naming the key and where it looked.
  virtual std::string get(const std::string& key, std::chrono::milliseconds timeout) = 0;
};
// <dir>/<key>, written atomically.
std::unique_ptr<Rendezvous> file_rendezvous(const std::string& dir);
// The run's control block (replay/control.h rendezvous slots).
std::unique_ptr<Rendezvous> control_rendezvous(replay::ControlBlock& ctl);

// Ranks on several nodes: the run's Redis server (cluster.redis.*; kf::netqueue
// StoreRendezvous). Keys kf:rdv:<scope>:<key>[:rank:<r>]. put() (rank 0) announces and
// waits up to `timeout` until every other rank has announced itself, then publishes;
// get() (rank r) announces and waits for the publication carrying its own token. A
// timeout throws kf::Error naming the server, the run and the ranks that never came.
struct RedisRendezvousOptions {
  std::string host = "127.0.0.1";
  int port = 6390;
  std::string user = "kf";
  std::string password;
  std::string scope;  // the run name
  int rank = 0, world = 1;
  std::chrono::milliseconds timeout{120000};
};
// True when this build has the Redis queue (hiredis found); redis_rendezvous throws otherwise.
bool redis_rendezvous_available();
std::unique_ptr<Rendezvous> redis_rendezvous(const RedisRendezvousOptions& opt);

std::unique_ptr<Communicator> make_local_comm();

// Rank 0 creates /dev/shm/<segment> (replacing a stale one), the others attach; it is
// unlinked once all ranks joined. chunk_bytes: staging per rank per round.
std::unique_ptr<Communicator> make_shm_comm(const std::string& segment, int rank, int world,
                                            std::chrono::milliseconds timeout = std::chrono::seconds(120),
                                            std::size_t chunk_bytes = 4u << 20);

// True when this build has NCCL (KF_HAVE_NCCL); make_nccl_comm throws kf::Error otherwise.
bool nccl_available();
// One rank per GPU (`device` is this rank's CUDA index). Rank 0 puts the unique id under
// `key`; the others get it (waiting up to timeout).
std::unique_ptr<Communicator> make_nccl_comm(int rank, int world, int device, Rendezvous& rdv,
                                             const std::string& key = "nccl_id",
                                             std::chrono::milliseconds timeout = std::chrono::seconds(120));

}  // namespace kf::learner

namespace kf::learner {

// --- GroupSource: where a learner rank gets its scored groups each step.
//  - ReplaySource: the run's ReplayBuffer (shared memory); each rank takes its share
//    (groups_per_step / ranks) of the ready groups, oldest policy version first; the
//    buffer drops groups older than the staleness bound at take time (counted).
//  - SyntheticSource: a deterministic stream for tests and benchmarks: group k of step s
//    depends only on (seed, s, k), and rank r of R gets groups k with k % R == r, so
//    R ranks together see exactly the batch one rank sees, and a resumed learner sees
//    exactly the data it would have seen.
// Threading: the learner thread.

struct TakeRequest {
  int64_t step = 0;  // the optimizer step being built
  int rank = 0, world = 1;
  int64_t groups = 0;   // this rank's share
  int64_t version = 0;  // the learner's current policy version
  int64_t max_lag = 0;
};

class GroupSource {
 public:
  virtual ~GroupSource() = default;
  virtual std::vector<replay::ScoredGroup> take(const TakeRequest& r) = 0;
  virtual uint64_t dropped_stale() const { return 0; }  // dropped before they reached the learner
};

class ReplaySource : public GroupSource {
 public:
  // Waits up to timeout_ms for the first ready group of a take.
  ReplaySource(replay::ReplayBuffer& buffer, int64_t timeout_ms) : buffer_(buffer), timeout_ms_(timeout_ms) {}
  std::vector<replay::ScoredGroup> take(const TakeRequest& r) override;
  uint64_t dropped_stale() const override;

 private:
  replay::ReplayBuffer& buffer_;
  int64_t timeout_ms_;
};

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

class SyntheticSource : public GroupSource {
 public:
  explicit SyntheticSource(SyntheticConfig cfg) : cfg_(cfg) {}
  std::vector<replay::ScoredGroup> take(const TakeRequest& r) override;
  // Group k of step `step` when the whole step has `total` groups (exposed for tests).
  replay::ScoredGroup make_group(int64_t step, int64_t k, int64_t version, int64_t max_lag) const;
  int64_t groups_per_step_total = 8;  // what all ranks together take per step

 private:
  SyntheticConfig cfg_;
};

// --- Publishing policy weights to the run's SnapshotStore for the actors, without
// stalling training for long.
//
// Blob format: a safetensors image in memory (u64 header length, JSON header with HF
// parameter names, dtype and offsets, then the data), so a reader needs nothing but
// kf::policy::st_parse; metadata carries "kf_version" (the policy version).
// A model with LoRA adapters publishes only the adapter tensors (megabytes, not the
// gigabytes of the frozen base), with metadata kf_lora_rank, kf_lora_alpha and
// kf_lora_targets (comma-separated): readers add the same adapters to their own copy of
// the base and apply them unmerged.
//
// publish(version): the learner thread only snapshots the weights: on CUDA a
// device-to-device cast into a staging buffer (the model may change right after), on
// CPU a cast-copy into the host blob. A background thread then copies device ->
// pinned host (own stream) and writes the store. A publish due while the previous one
// is still in flight first waits for it; that wait counts as stall.
// Threading: publish/wait/stats from the learner thread.

struct PublishStats {
  int64_t publishes = 0;
  double last_stall_ms = 0, max_stall_ms = 0, total_stall_ms = 0;
  double last_total_ms = 0;  // staging + copy + store write of the last finished publish
  uint64_t blob_bytes = 0;
};

class SnapshotPublisher {
 public:
  // dtype: kBFloat16 or kFloat32. `store` may be null (then only the blob is built,
  // e.g. for benchmarks); it must outlive the publisher.
  SnapshotPublisher(policy::CausalLM model, replay::SnapshotStore* store, torch::ScalarType dtype);
  ~SnapshotPublisher();
  SnapshotPublisher(const SnapshotPublisher&) = delete;
  SnapshotPublisher& operator=(const SnapshotPublisher&) = delete;

  void publish(int64_t version);
  void wait();  // until the background part of the last publish is done; rethrows its error
  PublishStats stats() const { return stats_; }
  uint64_t blob_bytes() const { return blob_bytes_; }
  // The host blob of the last finished publish (valid after wait()).
  const unsigned char* blob() const { return host_.data_ptr<unsigned char>(); }

 private:
  struct Slot {
    std::string name;
    torch::Tensor param, staging, host_view;
  };
  void background(int64_t version, double stall_ms, double t0);
  policy::CausalLM model_;
  replay::SnapshotStore* store_;
  torch::ScalarType dtype_;
  bool cuda_;
  torch::Tensor host_;  // uint8 blob (pinned on CUDA)
  uint64_t blob_bytes_ = 0;
  std::vector<Slot> slots_;
  std::thread worker_;
  std::exception_ptr error_;
  std::shared_ptr<void> ready_event_;  // at::cuda::CUDAEvent on CUDA builds
  PublishStats stats_;
};

// The blob metadata of a LoRA configuration (kf_lora_rank, kf_lora_alpha, kf_lora_targets).
std::map<std::string, std::string> lora_metadata(const policy::LoraConfig& c);

// Reader side: copies a blob published above into `model`'s parameters by name (any
// dtype conversion in the copy). Throws kf::Error naming `context` and the tensor on a
// missing or extra tensor or a shape mismatch. An adapter-only blob needs a model with
// the same adapters and fills only them. Returns the blob's kf_version (-1 if absent).
int64_t load_weights_blob(policy::CausalLM& model, const void* data, std::size_t bytes, const std::string& context);

// --- Learner: one data-parallel rank of the GRPO / pairwise trainer. Each step():
//   1. take this rank's share of scored groups from the GroupSource;
//   2. drop stale groups, skip groups without signal, compute advantages and pairs;
//   3. all-reduce the batch counts, so the loss is normalised over all ranks' tokens;
//   4. forward/backward over token-budgeted micro-batches (bf16 autocast on CUDA;
//      learner.pack: sequences packed into rows without padding), the last one
//      all-reducing gradient buckets as they complete;
//   5. clip, AdamW with the scheduled learning rate; the policy version becomes the
//      step count;
//   6. publish a snapshot every snapshot.every steps and checkpoint every
//      checkpoint.every steps (rank 0 writes; all ranks call).
// Log-probs are computed only at completion positions, the vocabulary head in chunks of
// learner.logit_chunk_tokens (policy::chunked_logprobs). With learner.lora.rank > 0 the
// base is frozen (bf16 under autocast) and only the adapters are trainable parameters:
// the optimizer, the gradient all-reduce, weights_checksum() and snapshots see adapters.
// Full fine-tuning trains fp32 weights, or bf16 weights whose fp32 masters live in the
// optimizer (learner.param_dtype).
// learner.dist.shard: params (ZeRO-3) keeps only this rank's slice of the weights between
// uses: model() then has whole weights only inside forward/backward, and
// publish_snapshot(), checkpoint(), weights_checksum(), named_weights() and
// load_checkpoint() gather them (collectives: every rank calls them, in the same order).
// A step in which no rank has usable data changes nothing and returns updated=false.
// Every rank keeps identical weights: rank 0's initial weights are broadcast, and the
// all-reduced gradients are bitwise identical on every rank (weights_checksum()).
// Threading: one thread drives a Learner.

struct LearnerDeps {
  Communicator* comm = nullptr;                // required
  GroupSource* source = nullptr;               // required
  replay::SnapshotStore* snapshots = nullptr;  // optional: where snapshots go (rank 0 publishes)
  replay::RunShm* shm = nullptr;               // optional: replay + kernel DB saved in checkpoints
  std::string checkpoint_dir;                  // optional: <run>/checkpoints
  torch::Device device = torch::kCPU;
};

struct StepStats {
  bool updated = false;
  int64_t step = 0;  // steps done after this one
  double loss = 0, grpo_loss = 0, pairwise_loss = 0, kl = 0, clip_fraction = 0, mean_ratio = 0;
  double grad_norm = 0, lr = 0;  // grad_norm: global L2 norm before clipping
  // Over all ranks' completion tokens: k3 estimate of KL(behaviour || current policy), with
  // r = exp(logp - behaviour): mean of (r - 1) - log r; and the mean exact entropy of the
  // current policy's next-token distribution (from the chunked logits, at no extra cost).
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
  // Share of the micro-batches' token slots that were padding, all ranks (0 when packed).
  double padding_fraction = 0;
  // k3 estimate of KL(current || start policy) over all ranks' completion tokens: mean of
  // exp(d) - 1 - d, d = log p_start - log p (LearnerConfig::kl_start_max_params); -1 when
  // not computed.
  double kl_start = -1;
  // Groups this step took, all ranks (set also on steps that did not train): in all, skipped
  // for equal rewards, and probe groups (Candidate::probe), never trained on.
  int64_t groups_in = 0, skipped_equal = 0, probe_groups = 0;
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
  // every rank loads it). Returns its step, or nullopt when there is none.
  // restore_shm: also reload the checkpoint's replay and kernel database into the run's
  // shared memory (resuming a stopped run); false when only this learner process was
  // restarted and the shared memory still holds the live run.
  std::optional<int64_t> resume(bool restore_shm = true);
  // Loads a specific checkpoint folder (weights, optimizer, step, RNG, counters; replay
  // and kernel DB into deps.shm on rank 0 when restore_shm).
  void load_checkpoint(const std::string& path, bool restore_shm = true);

  StepStats step();
  std::string checkpoint();  // all ranks call; rank 0 writes; returns the path ("" on others)
  void publish_snapshot();   // rank 0 publishes the current weights as version()
  // Every weight of the model, whole, as CPU copies in name order (sharded parameters:
  // gathered, collective).
  std::vector<std::pair<std::string, torch::Tensor>> named_weights();
  // Bytes of parameter storage this rank holds now, read from the tensors' storage (the
  // model's parameters, shared storage counted once, plus sharded-parameter slices).
  int64_t param_storage_bytes() const;

  int64_t steps_done() const { return step_; }
  int64_t version() const { return step_; }
  policy::CausalLM model() const { return model_; }
  const LearnerConfig& config() const { return cfg_; }
  uint64_t weights_checksum() const;  // xxh64 over all trainable weights, name order (sharded parameters: collective)
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
//   model.safetensors       trainable weights (fp32, HF names)
//   optimizer.safetensors   AdamW exp_avg / exp_avg_sq per parameter
//   reference.safetensors   the frozen reference, the start policy (when the objective or kl_start needs one)
//   config.json, tokenizer.json   the policy's HF config (and tokenizer, if it has one)
//   state.json              step, version, schedule, RNG states, counters, config echo
//   replay.bin, kernel_db.json    replay contents and kernel database (rank 0, when attached)
//   MANIFEST.json           every other file's size and 64-bit hash; written last
// Atomic: everything goes to a hidden temp folder first (each file fsynced), which is
// renamed into place and the parent fsynced, so a crash leaves the previous
// checkpoints intact and at most a temp folder (removed on the next write). Only the
// newest `keep` valid ones are kept: the one just written always counts, corrupt folders
// never do, so cleanup cannot delete the last good checkpoint.
// Corruption: find_latest_valid() checks the manifest of each checkpoint, newest first;
// a missing manifest, a size or hash mismatch is logged (which checkpoint, why, which one
// is used instead) and the previous checkpoint is tried. A corrupt folder is renamed to
// <name>.corrupt-<UTC time> (set_aside_corrupt), never overwritten or deleted.
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

std::string checkpoint_name(int64_t step);  // "step-000000000123"

// Writes <dir>/step-..., removes older ones beyond `keep` and stale temp folders.
// Returns the checkpoint's path. Throws kf::Error naming the file on I/O failure.
std::string write_checkpoint(const std::string& dir, const CheckpointData& data, int64_t keep);

// Throws kf::Error naming the checkpoint and the file and field that failed.
void verify_checkpoint(const std::string& path);

struct CheckpointRef {
  std::string path;
  int64_t step = 0;
};
// The newest checkpoint that verifies; corrupt ones newer than it are set aside with a warning.
std::optional<CheckpointRef> find_latest_valid(const std::string& dir);
std::vector<CheckpointRef> list_checkpoints(const std::string& dir);  // ascending step; step-<12 digits> only

// Every checkpoint folder, newest first, verified; changes nothing (tools/launch --resume
// reports these before it starts anything).
struct CheckpointCheck {
  std::string path;
  int64_t step = 0;
  std::string error;  // empty: valid; else why it is unusable
};
std::vector<CheckpointCheck> check_checkpoints(const std::string& dir);

// Renames an unusable checkpoint folder to <path>.corrupt-<UTC time> with a log line naming
// both paths and `why`; returns the new path (the old one if the rename failed, logged).
std::string set_aside_corrupt(const std::string& path, const std::string& why);

// Reads every tensor of a safetensors file to CPU (copies; the file is closed after).
std::map<std::string, torch::Tensor> read_tensors(const std::string& file);

// 64-bit content hash (XXH64, seed 0) of bytes and of a whole file.
uint64_t hash64(const void* data, std::size_t n, uint64_t seed = 0);
uint64_t hash_file(const std::string& path);

// Not std::filesystem::remove_all (libtorch exports a clashing symbol): nftw.
void remove_tree(const std::string& path);

// --- Export: a learner checkpoint -> an HF-format folder that transformers loads
// (config.json, model.safetensors, tokenizer.json when the checkpoint has one,
// generation_config.json, and the starting model's tokenizer_config.json with its chat
// template and named special tokens, chat_template.jinja and special_tokens_map.json).
// A LoRA checkpoint (state.json "lora") exports merged weights (W + alpha/r B A) by
// default, or with `peft` a PEFT adapter folder; the base comes from the checkpoint (a
// random-init base is saved there) or from the model folder the run started from
// (state.json lora.base_model, or base_model below).
// Used by tools/export.
// Plain function; any thread.

struct ExportOptions {
  std::string dtype = "float32";  // "float32" or "bfloat16" weights
  double temperature = 1.0;       // generation_config.json sampling defaults
  double top_p = 1.0;
  int64_t max_new_tokens = 2048;
  // The model folder the run started from, for its tokenizer_config.json (chat template,
  // eos/pad/bos tokens), chat_template.jinja and special_tokens_map.json. Empty: the
  // checkpoint's own copies, else the folder the run's config.yaml names in learner.policy.
  std::string base_model;
  // LoRA checkpoints only: write a PEFT adapter folder (adapter_config.json +
  // adapter_model.safetensors, PEFT's tensor names) instead of merged weights.
  bool peft = false;
};

// `checkpoint` is a checkpoint folder, a run's checkpoints/ folder or a run folder (then
// the newest valid checkpoint is used). The checkpoint is verified first. Throws
// kf::Error naming the file and field. Returns the checkpoint folder used.
std::string export_checkpoint(const std::string& checkpoint, const std::string& out_dir, const ExportOptions& opt = {});

}  // namespace kf::learner
