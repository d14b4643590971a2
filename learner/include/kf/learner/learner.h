// Learner: one data-parallel rank of the GRPO / pairwise trainer. Each step():
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
#pragma once
#include <torch/torch.h>

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "kf/learner/comm.h"
#include "kf/learner/group_source.h"
#include "kf/learner/learner_config.h"
#include "kf/learner/snapshot_publisher.h"
#include "kf/policy/policy.h"
#include "kf/replay/replay.h"

namespace kf::learner {

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

}  // namespace kf::learner
