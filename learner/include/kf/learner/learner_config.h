// LearnerConfig: every knob of the learner as one plain struct, read from the run config's
// `learner:` section (keys, defaults and help in common/src/config_schema.cpp).
// Why a struct: tests and benchmarks build one directly; the learner never reads the YAML.
// Plain data; any thread.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "kf/common/config.h"

namespace kf::learner {

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
};

// Reads the `learner.*` keys (and run.seed). Throws kf::Error naming the key for a value
// out of range (e.g. "learner.dist.ranks: must be >= 1").
LearnerConfig learner_config_from(const kf::Config& cfg);

}  // namespace kf::learner
