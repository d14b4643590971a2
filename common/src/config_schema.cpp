// The one table of configuration keys. Add a component's keys here, grouped by section.
#include <algorithm>
#include <limits>

#include "kf/common/config.h"

namespace kf {
namespace {

// Numeric ranges: a count, size, time or rate outside them is rejected at load, naming
// the key (a negative time limit would mean "no limit", a zero size an unusable run).
struct Bound {
  const char* path;
  double min;
  bool open;  // value must be > min (else >= min)
  double max = std::numeric_limits<double>::infinity();
};
constexpr bool GE = false, GT = true;
const Bound kBounds[] = {
    {"reference.warmup", 0, GE}, {"reference.trials", 1, GE},
    {"replay.candidate_queue.capacity", 1, GE}, {"replay.candidate_queue.slot_bytes", 1, GE},
    {"replay.candidate_queue.max_claims", 0, GE}, {"replay.groups.capacity", 1, GE},
    {"replay.groups.group_bytes", 1, GE}, {"replay.kernels.capacity", 1, GE},
    {"replay.kernels.source_bytes", 1, GE}, {"replay.kernels.max_per_task", 1, GE},
    {"replay.snapshot.max_bytes", 1, GE}, {"replay.stale_after_ms", 0, GE},
    {"evaluator.correctness_sets", 1, GE}, {"evaluator.stress_sets", 0, GE}, {"evaluator.warmup", 0, GE},
    {"evaluator.trials", 1, GE}, {"evaluator.max_trials", 1, GE}, {"evaluator.max_spread", 0, GT},
    {"evaluator.min_call_timeout_s", 0, GT}, {"evaluator.compile_timeout_s", 0, GT},
    {"evaluator.compile_jobs", 0, GE}, {"evaluator.cpu_threads", 0, GE}, {"evaluator.memory_limit_gb", 0, GT},
    {"evaluator.cache_limit_gb", 0, GE}, {"evaluator.gpu_memory_fraction", 0, GE, 1},
    {"evaluator.reward.clip", 0, GE}, {"evaluator.reward.window", 1, GE},
    {"actors.count", 1, GE}, {"actors.group_size", 1, GE}, {"actors.prompt.exemplars", 0, GE},
    {"actors.prompt.context_tokens", 0, GE}, {"actors.prompt.min_exemplar_tokens", 0, GE},
    {"actors.sampling.top_p", 0, GT, 1}, {"actors.sampling.top_k", 0, GE}, {"actors.sampling.max_new_tokens", 1, GE},
    {"actors.sampling.loop_repeats", 0, GE}, {"actors.sampling.loop_max_period", 1, GE},
    {"actors.sampling.loop_min_span", 0, GE}, {"actors.schedule.min_share", 0, GE, 1},
    {"actors.schedule.alpha", 0, GE}, {"actors.schedule.unlock_fraction", 0, GE, 1},
    {"actors.schedule.refresh_every", 1, GE}, {"actors.engine.max_sequences", 0, GE},
    {"actors.engine.kv_budget_mb", 1, GE}, {"actors.engine.block_size", 1, GE}, {"actors.engine.check_every", 1, GE},
    {"actors.group_deadline_s", 0, GT}, {"actors.metrics_every_s", 0, GT},
    {"launch.evaluators", 0, GE}, {"launch.max_minutes", 0, GE}, {"launch.hang_timeout_s", 0, GT},
    {"launch.max_restarts", 0, GE}, {"launch.restart_backoff_s", 0, GE}, {"launch.drain_timeout_s", 0, GT},
    {"launch.stop_timeout_s", 0, GT}, {"launch.status_every_s", 0, GT}, {"launch.metrics_every_s", 0, GT},
    {"launch.stats_window", 1, GE},
    {"cluster.head_evaluators", 0, GE}, {"cluster.redis.port", 1, GE, 65535}, {"cluster.redis.bound", 1, GE},
    {"cluster.redis.claim_idle_s", 0, GT}, {"cluster.redis.gone_after_s", 0, GT},
    {"cluster.head_learner_ranks", 0, GE}, {"cluster.learner_ranks", 1, GE}, {"cluster.learner_node_index", 0, GE},
    {"learner.steps", 0, GE}, {"learner.groups_per_step", 1, GE}, {"learner.min_groups_per_step", 1, GE},
    {"learner.take_timeout_ms", 0, GE}, {"learner.max_staleness", 0, GE}, {"learner.micro_batch_tokens", 1, GE},
    {"learner.temperature", 0, GE}, {"learner.grpo.adv_eps", 0, GE}, {"learner.grpo.clip_low", 0, GE},
    {"learner.grpo.clip_high", 0, GE}, {"learner.grpo.behaviour_weight_cap", 0, GT}, {"learner.grpo.kl_coef", 0, GE},
    {"learner.pairwise.coef", 0, GE}, {"learner.pairwise.beta", 0, GT}, {"learner.pairwise.pairs_per_group", 0, GE},
    {"learner.optim.lr", 0, GE}, {"learner.optim.beta1", 0, GE, 1}, {"learner.optim.beta2", 0, GE, 1},
    {"learner.optim.eps", 0, GT}, {"learner.optim.weight_decay", 0, GE}, {"learner.optim.grad_clip", 0, GE},
    {"learner.schedule.warmup_steps", 0, GE}, {"learner.schedule.total_steps", 1, GE},
    {"learner.schedule.min_lr_ratio", 0, GE, 1}, {"learner.dist.ranks", 1, GE}, {"learner.dist.bucket_mb", 1, GE},
    {"learner.snapshot.every", 0, GE}, {"learner.checkpoint.every", 0, GE}, {"learner.checkpoint.keep", 1, GE},
    {"learner.logit_chunk_tokens", 1, GE}, {"learner.recompute_min_params", 0, GE}, {"learner.lora.rank", 0, GE}, {"learner.lora.alpha", 0, GT},
};

std::vector<ConfigKey> with_bounds(std::vector<ConfigKey> keys) {
  for (const Bound& b : kBounds) {
    auto it = std::find_if(keys.begin(), keys.end(), [&](const ConfigKey& k) { return k.path == b.path; });
    if (it == keys.end()) continue;  // a key another build leaves out
    it->min = b.min;
    it->min_open = b.open;
    it->max = b.max;
  }
  return keys;
}
}  // namespace

const std::vector<ConfigKey>& config_schema() {
  using T = ConfigType;
  static const std::vector<ConfigKey> schema = with_bounds({
      // run: identity and placement of a run
      {"run.name", T::String, "default", false, {}, "run directory name under run.root"},
      {"run.root", T::String, "runs", false, {}, "folder that holds run directories"},
      {"run.seed", T::Int, "0", false, {}, "master seed for inputs, sampling and init"},
      {"run.backend", T::String, "auto", false, {"auto", "cpu", "cuda"}, "where references and kernels run"},
      {"run.log_level", T::String, "info", false, {"debug", "info", "warn", "error"}, "minimum log level"},
      // tasks: which task artifacts a run uses
      {"tasks.dir", T::String, "build/tasks", false, {}, "folder of imported task artifacts (tools/import-tasks)"},
      {"tasks.levels", T::IntList, "[1, 2, 3]", false, {}, "task levels to use"},
      {"tasks.include", T::StringList, "[]", false, {}, "task names to use (empty: all of the chosen levels)"},
      {"tasks.heldout", T::String, "\"\"", false, {}, "file of held-out task names a run never trains on (e.g. tasks/heldout.txt; empty: none)"},
      // reference: how the reference programs are timed in the foundation job
      {"reference.warmup", T::Int, "2", false, {}, "untimed reference calls before timing"},
      {"reference.trials", T::Int, "5", false, {}, "timed reference calls per task (median reported)"},
      // replay: sizes of the run's shared-memory segments (docs/replay.md)
      {"replay.candidate_queue.capacity", T::Int, "1024", false, {}, "candidate records in flight (actors -> evaluators)"},
      {"replay.candidate_queue.slot_bytes", T::Int, "131072", false, {}, "largest candidate record (prompt, completion, source)"},
      {"replay.candidate_queue.max_claims", T::Int, "3", false, {}, "evaluators that may die holding one candidate before it is counted lost (0: never re-queued)"},
      {"replay.groups.capacity", T::Int, "256", false, {}, "scored-group slots (the oldest policy version is evicted when full)"},
      {"replay.groups.group_bytes", T::Int, "1048576", false, {}, "largest encoded group (prompt + G candidates + results)"},
      {"replay.kernels.capacity", T::Int, "2048", false, {}, "kernel database entries"},
      {"replay.kernels.source_bytes", T::Int, "65536", false, {}, "largest kernel source kept"},
      {"replay.kernels.max_per_task", T::Int, "64", false, {}, "kernels kept per task (the slowest go first)"},
      {"replay.snapshot.max_bytes", T::Int, "67108864", false, {}, "largest policy weight blob"},
      {"replay.stale_after_ms", T::Int, "30000", false, {}, "a run with no heartbeat for this long is stale"},
      // evaluator: verification and timing of candidates (docs/evaluator.md)
      {"evaluator.correctness_sets", T::Int, "3", false, {}, "fresh input sets from the task's distribution"},
      {"evaluator.stress_sets", T::Int, "2", false, {}, "global stress sets: x*8 plus others drawn from -x, x+3, U(-4,4), x*1e-3 (local stress and near-duplicates come on top)"},
      {"evaluator.redraw_params", T::Bool, "true", false, {}, "check once with re-drawn parameters"},
      {"evaluator.warmup", T::Int, "2", false, {}, "untimed trials"},
      {"evaluator.trials", T::Int, "10", false, {}, "timed trials (reference and candidate interleaved)"},
      {"evaluator.max_trials", T::Int, "30", false, {}, "more trials while the spread is too wide, up to this"},
      {"evaluator.max_spread", T::Float, "0.5", false, {}, "give up when (p90-p10)/median stays above this"},
      {"evaluator.flush_cache", T::Bool, "true", false, {}, "flush caches before every timed call"},
      {"evaluator.min_call_timeout_s", T::Float, "10", false, {}, "wall-clock limit per kernel call (at least)"},
      {"evaluator.cuda_arch", T::String, "sm_90", false, {}, "nvcc -arch for CUDA candidates"},
      {"evaluator.compile_timeout_s", T::Float, "60", false, {}, "wall-clock limit per compile"},
      {"evaluator.compile_jobs", T::Int, "0", false, {}, "parallel compiles (0: all cores)"},
      {"evaluator.cpu_threads", T::Int, "0", false, {}, "CPU threads for reference and kernel (0: all)"},
      {"evaluator.memory_limit_gb", T::Float, "8", false, {}, "resident memory of a sandbox worker beyond its tensors"},
      {"evaluator.cache_limit_gb", T::Float, "2", false, {}, "CUDA: free the allocator cache after a candidate above this (0: never)"},
      {"evaluator.train_on_degenerate_tasks", T::Bool, "false", false, {}, "results of tasks flagged degenerate still go to the learner (they get no speed reward either way; default: left out)"},
      {"evaluator.gpu_memory_fraction", T::Float, "0.7", false, {}, "CUDA: share of GPU memory that verifications on it may claim (0: no claims)"},
      {"evaluator.gpu_lock", T::Bool, "true", false, {}, "hold the exclusive GPU timing lock per timed trial"},
      {"evaluator.reward.kind", T::String, "cuda_l1", false, {"cuda_l1", "speedup", "log_speedup"}, "reward of an ok result"},
      {"evaluator.reward.clip", T::Float, "2.0", false, {}, "rewards of ok results are clipped to [-clip, clip]"},
      {"evaluator.reward.window", T::Int, "1024", false, {}, "cuda_l1: running statistics over the last N ok results"},
      {"evaluator.reward.compile_error", T::Float, "-3.0", false, {}, "reward of a compile error"},
      {"evaluator.reward.runtime_error", T::Float, "-3.0", false, {}, "reward of a runtime error"},
      {"evaluator.reward.timeout", T::Float, "-3.0", false, {}, "reward of a timeout"},
      {"evaluator.reward.incorrect", T::Float, "-3.0", false, {}, "reward of a wrong result"},
      {"evaluator.reward.rejected_cheat", T::Float, "-4.0", false, {}, "reward of a rejected cheat"},
      // actors: prompts, group sampling, extraction (docs/actors.md)
      {"actors.count", T::Int, "1", false, {}, "actor processes of a run"},
      {"actors.device", T::String, "cpu", false, {}, "where an actor samples: cpu, cuda or cuda:N"},
      {"actors.group_size", T::Int, "8", false, {}, "G: completions per prompt (sharing one prefill)"},
      {"actors.prompt.mode", T::String, "contrastive", false, {"contrastive", "no_exemplars", "plain"}, "prompt kind (ablations: no_exemplars, plain)"},
      {"actors.prompt.template", T::String, "configs/prompts/contrastive.txt", false, {}, "prompt template file"},
      {"actors.prompt.abi_header", T::String, "evaluator/include/kf/kernel.h", false, {}, "kernel ABI header shown in prompts"},
      {"actors.prompt.exemplars", T::Int, "4", false, {}, "K: earlier kernels per prompt, one per speedup bucket"},
      {"actors.prompt.context_tokens", T::Int, "0", false, {}, "prompt + completion token budget (0: the model's max positions)"},
      {"actors.prompt.min_exemplar_tokens", T::Int, "64", false, {}, "an exemplar is dropped rather than cut below this"},
      {"actors.sampling.top_p", T::Float, "1.0", false, {}, "nucleus sampling (temperature: learner.temperature)"},
      {"actors.sampling.top_k", T::Int, "0", false, {}, "top-k sampling (0: off)"},
      {"actors.sampling.max_new_tokens", T::Int, "2048", false, {}, "most completion tokens"},
      {"actors.sampling.loop_repeats", T::Int, "4", false, {}, "loop stop: a row ends once a block repeats this often (0: off)"},
      {"actors.sampling.loop_max_period", T::Int, "128", false, {}, "loop stop: longest repeated block, in tokens"},
      {"actors.sampling.loop_min_span", T::Int, "64", false, {}, "loop stop: fewest tokens the repeats must span"},
      {"actors.sampling.shared_prefill", T::Bool, "true", false, {}, "prefill the prompt once per group"},
      {"actors.engine.max_sequences", T::Int, "0", false, {}, "rollout engine: most sequences decoded at once, several groups in flight (0: one group at a time)"},
      {"actors.engine.kv_budget_mb", T::Int, "1024", false, {}, "rollout engine: paged KV cache size (all layers, keys and values)"},
      {"actors.engine.block_size", T::Int, "16", false, {}, "rollout engine: tokens per KV block"},
      {"actors.engine.check_every", T::Int, "8", false, {}, "rollout engine: decode steps between stop checks and admissions"},
      {"actors.engine.cuda_graph", T::Bool, "true", false, {}, "rollout engine: replay the decode step as CUDA graphs (CUDA only)"},
      {"actors.schedule.policy", T::String, "room", false, {"uniform", "cycle", "room", "curriculum"}, "how tasks are chosen"},
      {"actors.schedule.min_share", T::Float, "0.2", false, {}, "probability of a uniform pick over all tasks"},
      {"actors.schedule.alpha", T::Float, "1.0", false, {}, "room = 1 / best_speedup^alpha"},
      {"actors.schedule.unlock_fraction", T::Float, "0.5", false, {}, "curriculum: solved fraction that opens the next level"},
      {"actors.schedule.refresh_every", T::Int, "16", false, {}, "task picks between kernel database reads"},
      {"actors.extract.marker", T::String, "kernel", false, {}, "word in the kernel block's fence: ```cuda kernel"},
      {"actors.extract.allow_unmarked", T::Bool, "true", false, {}, "take a single unmarked block defining kf_forward"},
      {"actors.score_extraction_failures", T::Bool, "true", false, {}, "actor scores failed extractions itself (not via evaluators)"},
      {"actors.group_deadline_s", T::Float, "600", false, {}, "a group is ready for the learner after this even if unscored"},
      {"actors.wait_for_snapshot", T::Bool, "false", false, {}, "sample only after the learner's first snapshot"},
      {"actors.metrics_every_s", T::Float, "10", false, {}, "seconds between metric lines"},
      // launch: the supervisor, tools/launch (docs/operations.md)
      {"launch.mode", T::String, "cluster", false, {"cluster", "serial"}, "cluster: one process per actor/evaluator/learner rank; serial: all in one process"},
      {"launch.evaluators", T::Int, "0", false, {}, "evaluator processes (0: one per visible GPU on CUDA, one on CPU)"},
      {"launch.cpu_affinity", T::Bool, "true", false, {}, "pin evaluators to their own cores (the rest go to actors and learners)"},
      {"launch.max_minutes", T::Float, "0", false, {}, "wall-clock budget; then drain, checkpoint and stop (0: none)"},
      {"launch.hang_timeout_s", T::Float, "300", false, {}, "a worker whose heartbeat is older than this is killed and restarted"},
      {"launch.max_restarts", T::Int, "5", false, {}, "restarts of one worker before the run is stopped"},
      {"launch.restart_backoff_s", T::Float, "1", false, {}, "first restart delay (doubles per restart of the same worker, up to 30 s)"},
      {"launch.drain_timeout_s", T::Float, "60", false, {}, "after SIGINT: how long actors and evaluators get to finish queued work"},
      {"launch.stop_timeout_s", T::Float, "120", false, {}, "how long learners get for their final checkpoint before SIGKILL"},
      {"launch.status_every_s", T::Float, "10", false, {}, "seconds between status log lines when stdout is not a terminal"},
      {"launch.metrics_every_s", T::Float, "5", false, {}, "seconds between metrics/run.jsonl lines"},
      {"launch.stats_window", T::Int, "256", false, {}, "results over which correct %, cheat % and speedups are reported"},
      // cluster: several nodes, candidates and results on Redis Streams (docs/operations.md, Several nodes)
      {"cluster.role", T::String, "all", false, {"all", "head", "evaluators", "learners"}, "all: one node, shared memory only; head: replay, learner, actors and the Redis server; evaluators: evaluators fed from the head's Redis; learners: learner ranks whose groups come from the head's rank 0"},
      {"cluster.node_name", T::String, "\"\"", false, {}, "this node's name in consumer names and folders (empty: the host name)"},
      {"cluster.head_evaluators", T::Int, "0", false, {}, "head: evaluator processes on the head node itself (beside the remote ones)"},
      {"cluster.head_learner_ranks", T::Int, "0", false, {}, "head: learner ranks 0..N-1 run on the head, the rest of learner.dist.ranks on learners nodes (0: all on the head); needs NCCL on CUDA"},
      {"cluster.learner_ranks", T::Int, "1", false, {}, "learners node: the learner ranks it runs (one per GPU)"},
      {"cluster.learner_node_index", T::Int, "0", false, {}, "learners node: its place among the learners nodes (0, 1, ...): it runs ranks head_learner_ranks + index x learner_ranks onwards (--slurm sets it)"},
      {"cluster.nodes", T::StringList, "[]", false, {}, "--slurm: role per node (head, evaluators, learners), by SLURM_NODEID (empty: node 0 head, the rest evaluators)"},
      {"cluster.redis.host", T::String, "127.0.0.1", false, {}, "the head's Redis server, as evaluator nodes reach it (--slurm: the first node)"},
      {"cluster.redis.port", T::Int, "6390", false, {}, "its port"},
      {"cluster.redis.bind", T::StringList, "[]", false, {}, "head: addresses the server listens on (empty: cluster.redis.host)"},
      {"cluster.redis.password_env", T::String, "KF_REDIS_PASSWORD", false, {}, "environment variable holding the server's password (required)"},
      {"cluster.redis.bound", T::Int, "512", false, {}, "most candidates on the network at once (in kf:candidates or with an evaluator)"},
      {"cluster.redis.claim_idle_s", T::Float, "120", false, {}, "a candidate an evaluator holds this long without a heartbeat goes to another"},
      {"cluster.redis.gone_after_s", T::Float, "60", false, {}, "evaluator node: the head's server unreachable this long ends the node"},
      // learner: GRPO / pairwise training of the policy (docs/learner.md)
      {"learner.policy", T::String, "\"\"", false, {}, "initial policy folder (HF format); empty: random init of learner.init_shape"},
      {"learner.init_shape", T::String, "tiny", false, {}, "model shape for a random init: tiny, qwen2.5-0.5b, or the path of an HF config.json (configs/shapes/)"},
      {"learner.steps", T::Int, "0", false, {}, "optimizer steps to run (0: until the run stops)"},
      {"learner.objective", T::String, "grpo", false, {"grpo", "pairwise", "grpo+pairwise"}, "training objective"},
      {"learner.groups_per_step", T::Int, "8", false, {}, "scored groups per optimizer step, summed over ranks"},
      {"learner.min_groups_per_step", T::Int, "1", false, {}, "a step waits until it has this many groups (over all ranks)"},
      {"learner.take_timeout_ms", T::Int, "1000", false, {}, "how long a rank waits for ready groups per pull"},
      {"learner.max_staleness", T::Int, "4", false, {}, "drop groups whose policy version lags the learner's by more"},
      {"learner.micro_batch_tokens", T::Int, "16384", false, {}, "tokens per micro-batch (gradient accumulation): one packed row with learner.pack, else rows x longest sequence"},
      {"learner.temperature", T::Float, "1.0", false, {}, "sampling temperature the behaviour log-probs were taken at"},
      {"learner.precision", T::String, "auto", false, {"auto", "fp32", "bf16"}, "auto: bf16 autocast on CUDA, fp32 on CPU"},
      {"learner.gradient_checkpointing", T::Bool, "false", false, {}, "recompute decoder layers in backward"},
      {"learner.deterministic", T::Bool, "false", false, {}, "deterministic algorithms (exact resume on CPU)"},
      {"learner.grpo.std_normalize", T::Bool, "false", false, {}, "divide group advantages by the group's reward std"},
      {"learner.grpo.adv_eps", T::Float, "1e-6", false, {}, "added to the std when normalising"},
      {"learner.grpo.ratio", T::String, "behaviour", false, {"behaviour", "decoupled"}, "clip against the behaviour log-probs, or decoupled PPO (AReaL)"},
      {"learner.grpo.clip_low", T::Float, "0.2", false, {}, "ratio clip 1 - clip_low"},
      {"learner.grpo.clip_high", T::Float, "0.2", false, {}, "ratio clip 1 + clip_high (DAPO clip-higher: 0.28)"},
      {"learner.grpo.behaviour_weight_cap", T::Float, "5.0", false, {}, "decoupled: cap on pi_prox / pi_behaviour"},
      {"learner.grpo.kl_coef", T::Float, "0.0", false, {}, "k3 KL penalty to the frozen reference (0: no reference model)"},
      {"learner.grpo.aggregation", T::String, "token", false, {"token", "sequence"}, "loss mean over all tokens, or per sequence then over sequences"},
      {"learner.pairwise.coef", T::Float, "1.0", false, {}, "weight of the pairwise (DPO) loss"},
      {"learner.pairwise.beta", T::Float, "0.1", false, {}, "DPO beta on the log-prob margin"},
      {"learner.pairwise.pairs_per_group", T::Int, "4", false, {}, "most (faster, slower) pairs taken from one group"},
      {"learner.pairwise.min_reward_gap", T::Float, "0.0", false, {}, "a pair needs reward(faster) - reward(slower) above this"},
      {"learner.optim.lr", T::Float, "1e-6", false, {}, "AdamW peak learning rate"},
      {"learner.optim.beta1", T::Float, "0.9", false, {}, "AdamW beta1"},
      {"learner.optim.beta2", T::Float, "0.999", false, {}, "AdamW beta2"},
      {"learner.optim.eps", T::Float, "1e-8", false, {}, "AdamW epsilon"},
      {"learner.optim.weight_decay", T::Float, "0.0", false, {}, "AdamW decoupled weight decay"},
      {"learner.optim.grad_clip", T::Float, "1.0", false, {}, "global gradient L2-norm clip (0: off)"},
      {"learner.schedule.kind", T::String, "constant", false, {"constant", "linear", "cosine"}, "learning-rate decay after warm-up"},
      {"learner.schedule.warmup_steps", T::Int, "10", false, {}, "linear warm-up steps"},
      {"learner.schedule.total_steps", T::Int, "1000", false, {}, "steps over which linear/cosine decay runs"},
      {"learner.schedule.min_lr_ratio", T::Float, "0.1", false, {}, "final learning rate as a fraction of the peak"},
      {"learner.dist.ranks", T::Int, "1", false, {}, "data-parallel learner ranks (one per GPU)"},
      {"learner.dist.comm", T::String, "auto", false, {"auto", "cpu", "nccl"}, "gradient all-reduce: NCCL on GPU, shared memory on CPU"},
      {"learner.dist.bucket_mb", T::Int, "25", false, {}, "gradient all-reduce bucket size (MiB)"},
      {"learner.dist.shard", T::String, "none", false, {"none", "optimizer", "gradients"}, "optimizer: each rank keeps fp32 master weights and Adam moments for 1/ranks of the parameters (ZeRO-1, gradients reduce-scattered, parameters all-gathered); gradients: and only its slice of the gradients (ZeRO-2, every micro-batch reduced)"},
      {"learner.snapshot.every", T::Int, "1", false, {}, "publish weights to the snapshot store every N steps (0: never)"},
      {"learner.snapshot.dtype", T::String, "bf16", false, {"bf16", "fp32"}, "dtype of published weights"},
      {"learner.checkpoint.every", T::Int, "100", false, {}, "checkpoint every N steps (0: only at stop; tools/launch needs >= 1)"},
      {"learner.checkpoint.keep", T::Int, "3", false, {}, "keep the last K checkpoints"},
      // learner: chunked head (docs/learner.md "Optimisation") and LoRA (docs/learner-scale.md)
      {"learner.recompute_min_params", T::Int, "3000000000", false, {}, "recompute decoder layers in backward (as learner.gradient_checkpointing) for models of at least this many parameters (0: only by learner.gradient_checkpointing)"},
      {"learner.logit_chunk_tokens", T::Int, "1024", false, {}, "completion positions per chunk of the vocabulary projection + log-softmax (the [tokens x vocab] logits are never built whole)"},
      {"learner.lora.rank", T::Int, "0", false, {}, "LoRA adapter rank (0: full fine-tuning); the base stays frozen"},
      {"learner.lora.alpha", T::Float, "16.0", false, {}, "LoRA scale alpha (the adapter output is multiplied by alpha / rank)"},
      {"learner.lora.targets", T::StringList, "[q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj]", false, {}, "projections that get adapters"},
      // learner: packed sequences and parameter dtype (docs/learner-scale.md "Memory")
      {"learner.pack", T::Bool, "true", false, {}, "concatenate sequences into rows of learner.micro_batch_tokens tokens (positions restart and attention stays inside each sequence: no padding); false: rows right-padded to the longest sequence of their micro-batch"},
      {"learner.param_dtype", T::String, "auto", false, {"auto", "fp32", "bf16"}, "dtype of the trained weights (full fine-tuning); bf16 keeps an fp32 master copy in the optimizer; auto: bf16 on CUDA when learner.dist.shard is not none, else fp32"},
  });
  return schema;
}

}  // namespace kf
