#include "kf/learner/learner.h"

#include <unistd.h>

#include "kf/common/error.h"

namespace kf::learner {
namespace {
void require(bool ok, const std::string& key, const std::string& what) {
  if (!ok) throw Error(key + ": " + what);
}
}  // namespace

LearnerConfig learner_config_from(const kf::Config& c) {
  LearnerConfig l;
  l.seed = static_cast<uint64_t>(c.get_int("run.seed"));
  l.policy = c.get_string("learner.policy");
  l.init_shape = c.get_string("learner.init_shape");
  l.steps = c.get_int("learner.steps");
  const auto obj = c.get_string("learner.objective");
  l.objective = obj == "grpo" ? Objective::grpo : obj == "pairwise" ? Objective::pairwise : Objective::grpo_pairwise;
  l.groups_per_step = c.get_int("learner.groups_per_step");
  l.min_groups_per_step = c.get_int("learner.min_groups_per_step");
  l.take_timeout_ms = c.get_int("learner.take_timeout_ms");
  l.max_staleness = c.get_int("learner.max_staleness");
  l.micro_batch_tokens = c.get_int("learner.micro_batch_tokens");
  l.pack = c.get_bool("learner.pack");
  l.param_dtype = c.get_string("learner.param_dtype");
  l.temperature = c.get_float("learner.temperature");
  l.precision = c.get_string("learner.precision");
  l.gradient_checkpointing = c.get_bool("learner.gradient_checkpointing");
  l.deterministic = c.get_bool("learner.deterministic");
  l.grpo.std_normalize = c.get_bool("learner.grpo.std_normalize");
  l.grpo.shuffle_rewards = c.get_bool("learner.grpo.shuffle_rewards");
  l.grpo.adv_eps = c.get_float("learner.grpo.adv_eps");
  l.grpo.ratio = c.get_string("learner.grpo.ratio") == "decoupled" ? RatioMode::decoupled : RatioMode::behaviour;
  l.grpo.clip_low = c.get_float("learner.grpo.clip_low");
  l.grpo.clip_high = c.get_float("learner.grpo.clip_high");
  l.grpo.behaviour_weight_cap = c.get_float("learner.grpo.behaviour_weight_cap");
  l.grpo.kl_coef = c.get_float("learner.grpo.kl_coef");
  l.grpo.aggregation =
      c.get_string("learner.grpo.aggregation") == "sequence" ? Aggregation::sequence : Aggregation::token;
  l.pairwise.coef = c.get_float("learner.pairwise.coef");
  l.pairwise.beta = c.get_float("learner.pairwise.beta");
  l.pairwise.pairs_per_group = c.get_int("learner.pairwise.pairs_per_group");
  l.pairwise.min_reward_gap = c.get_float("learner.pairwise.min_reward_gap");
  l.optim.lr = c.get_float("learner.optim.lr");
  l.optim.beta1 = c.get_float("learner.optim.beta1");
  l.optim.beta2 = c.get_float("learner.optim.beta2");
  l.optim.eps = c.get_float("learner.optim.eps");
  l.optim.weight_decay = c.get_float("learner.optim.weight_decay");
  l.optim.grad_clip = c.get_float("learner.optim.grad_clip");
  const auto kind = c.get_string("learner.schedule.kind");
  l.schedule.kind = kind == "cosine"   ? ScheduleKind::cosine
                    : kind == "linear" ? ScheduleKind::linear
                                       : ScheduleKind::constant;
  l.schedule.warmup_steps = c.get_int("learner.schedule.warmup_steps");
  l.schedule.total_steps = c.get_int("learner.schedule.total_steps");
  l.schedule.min_lr_ratio = c.get_float("learner.schedule.min_lr_ratio");
  l.ranks = c.get_int("learner.dist.ranks");
  l.comm = c.get_string("learner.dist.comm");
  l.bucket_mb = c.get_int("learner.dist.bucket_mb");
  const auto shard = c.get_string("learner.dist.shard");
  l.shard = shard == "optimizer"   ? ShardMode::optimizer
            : shard == "gradients" ? ShardMode::gradients
            : shard == "params"    ? ShardMode::params
                                   : ShardMode::none;
  l.snapshot_every = c.get_int("learner.snapshot.every");
  l.snapshot_dtype = c.get_string("learner.snapshot.dtype");
  l.checkpoint_every = c.get_int("learner.checkpoint.every");
  l.checkpoint_keep = c.get_int("learner.checkpoint.keep");
  l.logit_chunk_tokens = c.get_int("learner.logit_chunk_tokens");
  l.recompute_min_params = c.get_int("learner.recompute_min_params");
  l.recompute_layers = c.get_int("learner.recompute_layers");
  l.kl_start_max_params = c.get_int("learner.kl_start_max_params");
  l.lora_rank = c.get_int("learner.lora.rank");
  l.lora_alpha = c.get_float("learner.lora.alpha");
  l.lora_targets = c.get_strings("learner.lora.targets");
  const std::string src = c.source() + ": ";
  require(l.groups_per_step >= 1, src + "learner.groups_per_step", "must be >= 1");
  require(l.min_groups_per_step >= 1 && l.min_groups_per_step <= l.groups_per_step, src + "learner.min_groups_per_step",
          "must be in [1, learner.groups_per_step]");
  require(l.max_staleness >= 0, src + "learner.max_staleness", "must be >= 0");
  require(l.micro_batch_tokens >= 2, src + "learner.micro_batch_tokens", "must be >= 2");
  require(l.temperature > 0, src + "learner.temperature", "must be > 0");
  require(l.grpo.clip_low >= 0 && l.grpo.clip_low < 1, src + "learner.grpo.clip_low", "must be in [0, 1)");
  require(l.grpo.clip_high >= 0, src + "learner.grpo.clip_high", "must be >= 0");
  require(l.grpo.behaviour_weight_cap > 0, src + "learner.grpo.behaviour_weight_cap", "must be > 0");
  require(l.pairwise.beta > 0, src + "learner.pairwise.beta", "must be > 0");
  require(l.pairwise.pairs_per_group >= 1, src + "learner.pairwise.pairs_per_group", "must be >= 1");
  require(l.optim.lr >= 0, src + "learner.optim.lr", "must be >= 0");
  require(l.optim.beta1 >= 0 && l.optim.beta1 < 1, src + "learner.optim.beta1", "must be in [0, 1)");
  require(l.optim.beta2 >= 0 && l.optim.beta2 < 1, src + "learner.optim.beta2", "must be in [0, 1)");
  require(l.schedule.warmup_steps >= 0, src + "learner.schedule.warmup_steps", "must be >= 0");
  require(l.ranks >= 1 && l.ranks <= 64, src + "learner.dist.ranks", "must be in 1..64");
  require(l.bucket_mb >= 1, src + "learner.dist.bucket_mb", "must be >= 1");
  // A random init's shape: a named one, or an HF config.json (read when the learner starts).
  if (l.policy.empty() && l.init_shape != "tiny" && l.init_shape != "qwen2.5-0.5b") {
    const auto& p = l.init_shape;
    require(p.size() > 5 && p.compare(p.size() - 5, 5, ".json") == 0, src + "learner.init_shape",
            "'" + p + "' is neither a named shape (tiny, qwen2.5-0.5b) nor the path of a config.json");
    require(::access(p.c_str(), R_OK) == 0, src + "learner.init_shape", "'" + p + "': cannot read that file");
  }
  require(l.checkpoint_keep >= 1, src + "learner.checkpoint.keep", "must be >= 1");
  require(l.logit_chunk_tokens >= 1, src + "learner.logit_chunk_tokens", "must be >= 1");
  require(l.recompute_min_params >= 0, src + "learner.recompute_min_params", "must be >= 0 (0: off)");
  require(l.recompute_layers >= -1, src + "learner.recompute_layers", "must be >= -1 (-1: every layer)");
  require(l.kl_start_max_params >= 0, src + "learner.kl_start_max_params", "must be >= 0 (0: only when free)");
  require(l.lora_rank >= 0, src + "learner.lora.rank", "must be >= 0 (0: no LoRA)");
  require(l.lora_alpha > 0, src + "learner.lora.alpha", "must be > 0");
  // ZeRO-3 shards trainable weights; LoRA's trainable weights are the adapters (megabytes)
  // and its frozen base would stay whole on every rank: there is nothing for it to save.
  require(!(l.lora_rank > 0 && l.shard == ShardMode::params), src + "learner.dist.shard",
          "params (ZeRO-3) cannot be combined with learner.lora.rank > 0 (LoRA trains small adapters on a frozen "
          "base that every rank holds whole); use learner.dist.shard: gradients or none with LoRA");
  if (l.lora_rank > 0) {
    require(!l.lora_targets.empty(), src + "learner.lora.targets",
            "must name at least one projection when learner.lora.rank > 0");
    for (std::size_t i = 0; i < l.lora_targets.size(); ++i) {
      const auto& t = l.lora_targets[i];
      require(t == "q_proj" || t == "k_proj" || t == "v_proj" || t == "o_proj" || t == "gate_proj" || t == "up_proj" ||
                  t == "down_proj",
              src + "learner.lora.targets",
              "'" + t + "' is not a projection (q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj)");
      for (std::size_t j = 0; j < i; ++j)
        require(l.lora_targets[j] != t, src + "learner.lora.targets", "'" + t + "' is listed twice");
    }
  }
  return l;
}

}  // namespace kf::learner
