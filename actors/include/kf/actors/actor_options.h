// ActorOptions: every knob of an actor as one plain struct, read from the run config's
// `actors:` section (plus run.seed, run.backend, tasks.*, learner.policy/init_shape/
// temperature and evaluator.reward.compile_error; keys and help in
// common/src/config_schema.cpp). Tests build one directly. Plain data; any thread.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "kf/actors/extract.h"
#include "kf/actors/prompt.h"
#include "kf/actors/scheduler.h"
#include "kf/common/config.h"
#include "kf/tasks/tasks.h"

namespace kf::actors {

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

}  // namespace kf::actors
