// ActorOptions from the run config (actor_options) and where the source tree's defaults are
// (resolve_tree_path): the range checks name the file and key.
#include "kf/actors/actors.h"

#include <sys/stat.h>

#include <cstdlib>

#include "kf/common/error.h"
#include "kf/tasks/tasks.h"
#include "prompt.h"
#include "scheduler.h"

#ifndef KF_SOURCE_DIR_BUILT
#define KF_SOURCE_DIR_BUILT "."
#endif

namespace kf::actors {

namespace {
bool exists(const std::string& p) {
  struct stat st;
  return ::stat(p.c_str(), &st) == 0;
}
// Whether the build's schema declares `key` (keys added with a feature are read only then).
bool declared(const std::string& key) {
  for (const auto& k : config_schema())
    if (k.path == key) return true;
  return false;
}
}  // namespace

std::string resolve_tree_path(const std::string& path) {
  if (path.empty() || path[0] == '/' || exists(path)) return path;
  if (const char* s = std::getenv("KF_SOURCE_DIR"); s && *s && exists(std::string(s) + "/" + path))
    return std::string(s) + "/" + path;
  if (exists(std::string(KF_SOURCE_DIR_BUILT) + "/" + path)) return std::string(KF_SOURCE_DIR_BUILT) + "/" + path;
  return path;
}

ActorOptions actor_options(const Config& cfg, int actor_id) {
  ActorOptions o;
  const std::string src = cfg.source();
  auto bad = [&](const std::string& key, const std::string& msg) { return error_at(src, key + ": " + msg); };
  o.id = actor_id;
  o.seed = static_cast<uint64_t>(cfg.get_int("run.seed"));
  o.device = cfg.get_string("actors.device");
  if (o.device != "cpu" && o.device.rfind("cuda", 0) != 0)
    throw bad("actors.device", "'" + o.device + "' (cpu, cuda, cuda:N)");
  o.backend = tasks::resolve_backend(cfg.get_string("run.backend"));
  o.tasks_dir = cfg.get_string("tasks.dir");
  o.levels = cfg.get_ints("tasks.levels");
  o.include = cfg.get_strings("tasks.include");
  if (const auto heldout = cfg.get_string("tasks.heldout"); !heldout.empty()) {
    try {
      o.heldout = tasks::read_task_list(resolve_tree_path(heldout));
    } catch (const Error& e) {
      throw bad("tasks.heldout", e.what());
    }
  }
  o.policy_dir = cfg.get_string("learner.policy");
  o.init_shape = cfg.get_string("learner.init_shape");
  o.temperature = cfg.get_float("learner.temperature");
  o.extraction_failure_reward = cfg.get_float("evaluator.reward.compile_error");

  o.mode = parse_prompt_mode(cfg.get_string("actors.prompt.mode"), src + ": actors.prompt.mode");
  o.template_path = cfg.get_string("actors.prompt.template");
  // A reasoning model's switch: "template" leaves it to the chat template's default.
  if (const auto think = cfg.get_string("actors.prompt.enable_thinking"); think != "template")
    o.chat_vars = std::string("{\"enable_thinking\": ") + (think == "true" ? "true" : "false") + "}";
  o.abi_header_path = cfg.get_string("actors.prompt.abi_header");
  o.exemplars = cfg.get_int("actors.prompt.exemplars");
  if (o.exemplars < 0 || o.exemplars > 32) throw bad("actors.prompt.exemplars", "must be in [0, 32]");
  o.context_tokens = cfg.get_int("actors.prompt.context_tokens");
  if (o.context_tokens < 0) throw bad("actors.prompt.context_tokens", "must be >= 0");
  o.min_exemplar_tokens = cfg.get_int("actors.prompt.min_exemplar_tokens");
  if (o.min_exemplar_tokens < 1) throw bad("actors.prompt.min_exemplar_tokens", "must be >= 1");

  o.group_size = cfg.get_int("actors.group_size");
  if (o.group_size < 1 || o.group_size > 64)
    throw bad("actors.group_size", "must be in [1, 64] (replay groups hold at most 64)");
  o.top_p = cfg.get_float("actors.sampling.top_p");
  if (o.top_p <= 0 || o.top_p > 1) throw bad("actors.sampling.top_p", "must be in (0, 1]");
  o.top_k = cfg.get_int("actors.sampling.top_k");
  if (o.top_k < 0) throw bad("actors.sampling.top_k", "must be >= 0");
  o.max_new_tokens = cfg.get_int("actors.sampling.max_new_tokens");
  if (o.max_new_tokens < 1) throw bad("actors.sampling.max_new_tokens", "must be >= 1");
  o.loop_repeats = cfg.get_int("actors.sampling.loop_repeats");
  if (o.loop_repeats < 0 || o.loop_repeats == 1) throw bad("actors.sampling.loop_repeats", "must be 0 (off) or >= 2");
  o.loop_max_period = cfg.get_int("actors.sampling.loop_max_period");
  if (o.loop_max_period < 1) throw bad("actors.sampling.loop_max_period", "must be >= 1");
  o.loop_min_span = cfg.get_int("actors.sampling.loop_min_span");
  if (o.loop_min_span < 0) throw bad("actors.sampling.loop_min_span", "must be >= 0");
  o.shared_prefill = cfg.get_bool("actors.sampling.shared_prefill");
  o.engine_max_sequences = cfg.get_int("actors.engine.max_sequences");
  if (o.engine_max_sequences < 0) throw bad("actors.engine.max_sequences", "must be >= 0 (0: one group at a time)");
  if (o.engine_max_sequences > 0 && o.engine_max_sequences < o.group_size)
    throw bad("actors.engine.max_sequences",
              "must be 0 or at least actors.group_size (" + std::to_string(o.group_size) + ")");
  o.engine_kv_budget_mb = cfg.get_int("actors.engine.kv_budget_mb");
  if (o.engine_kv_budget_mb < 1) throw bad("actors.engine.kv_budget_mb", "must be >= 1");
  o.engine_block_size = cfg.get_int("actors.engine.block_size");
  if (o.engine_block_size < 1) throw bad("actors.engine.block_size", "must be >= 1");
  o.engine_check_every = cfg.get_int("actors.engine.check_every");
  if (o.engine_check_every < 1) throw bad("actors.engine.check_every", "must be >= 1");
  o.engine_cuda_graph = cfg.get_bool("actors.engine.cuda_graph");

  o.schedule.policy = parse_schedule_policy(cfg.get_string("actors.schedule.policy"), src + ": actors.schedule.policy");
  o.schedule.min_share = cfg.get_float("actors.schedule.min_share");
  if (o.schedule.min_share < 0 || o.schedule.min_share > 1) throw bad("actors.schedule.min_share", "must be in [0, 1]");
  o.schedule.alpha = cfg.get_float("actors.schedule.alpha");
  o.schedule.unlock_fraction = cfg.get_float("actors.schedule.unlock_fraction");
  o.stats_refresh_every = cfg.get_int("actors.schedule.refresh_every");
  if (o.stats_refresh_every < 1) throw bad("actors.schedule.refresh_every", "must be >= 1");

  o.extract.marker = cfg.get_string("actors.extract.marker");
  if (o.extract.marker.empty() || o.extract.marker.find_first_of(" \t`") != std::string::npos)
    throw bad("actors.extract.marker", "must be one word without spaces or backticks");
  o.extract.allow_unmarked = cfg.get_bool("actors.extract.allow_unmarked");
  o.extract.max_bytes = static_cast<std::size_t>(cfg.get_int("replay.kernels.source_bytes"));
  o.score_extraction_failures = cfg.get_bool("actors.score_extraction_failures");
  if (declared("actors.turns")) {
    o.turns = cfg.get_int("actors.turns");
    if (o.turns < 1 || o.turns > 8) throw bad("actors.turns", "must be in [1, 8] (1: single turn)");
  }
  if (declared("actors.prompt.feedback")) o.feedback_path = cfg.get_string("actors.prompt.feedback");
  o.probe_every = cfg.get_int("actors.probe.every");
  if (o.probe_every < 0) throw bad("actors.probe.every", "must be >= 0 (0: off)");
  o.probe_tasks = cfg.get_strings("actors.probe.tasks");
  o.probe_samples = cfg.get_int("actors.probe.samples");
  if (o.probe_samples < 1 || o.probe_samples > 64)
    throw bad("actors.probe.samples", "must be in [1, 64] (one replay group holds at most 64)");
  o.group_deadline_s = cfg.get_float("actors.group_deadline_s");
  if (o.group_deadline_s <= 0) throw bad("actors.group_deadline_s", "must be > 0");
  o.wait_for_snapshot = cfg.get_bool("actors.wait_for_snapshot");
  o.metrics_every_s = cfg.get_float("actors.metrics_every_s");
  return o;
}

}  // namespace kf::actors
