// EvalOptions from the run's config (the evaluator.* keys of config_schema.cpp).
#include "kf/common/config.h"
#include "kf/common/error.h"
#include "kf/evaluator/evaluator.h"

namespace kf::evaluator {
namespace {

int positive(const Config& c, const std::string& key, int64_t lo) {
  const int64_t v = c.get_int(key);
  if (v < lo || v > 100000) throw error_at(c.source(), key + ": " + std::to_string(v) + " is out of range");
  return int(v);
}
double at_least(const Config& c, const std::string& key, double lo) {
  const double v = c.get_float(key);
  if (!(v >= lo))
    throw error_at(c.source(), key + ": " + std::to_string(v) + " must be at least " + std::to_string(lo));
  return v;
}

}  // namespace

EvalOptions eval_options(const Config& c) {
  EvalOptions o;
  o.seed = uint64_t(c.get_int("run.seed"));
  o.correctness_sets = positive(c, "evaluator.correctness_sets", 2);
  o.stress_sets = positive(c, "evaluator.stress_sets", 0);
  o.redraw_params = c.get_bool("evaluator.redraw_params");
  o.warmup = positive(c, "evaluator.warmup", 0);
  o.trials = positive(c, "evaluator.trials", 1);
  o.max_trials = positive(c, "evaluator.max_trials", o.trials);
  o.max_spread = at_least(c, "evaluator.max_spread", 0.0);
  o.ref_slowdown_limit = at_least(c, "evaluator.ref_slowdown_limit", 1.0);
  o.sandbox.private_proc_cuda = c.get_bool("evaluator.private_proc_cuda");
  o.flush_cache = c.get_bool("evaluator.flush_cache");
  o.min_call_timeout_s = at_least(c, "evaluator.min_call_timeout_s", 0.1);
  o.compile.cuda_arch = c.get_string("evaluator.cuda_arch");
  o.compile.time_limit_s = at_least(c, "evaluator.compile_timeout_s", 1.0);
  o.compile.jobs = positive(c, "evaluator.compile_jobs", 0);
  o.cpu_threads = positive(c, "evaluator.cpu_threads", 0);
  o.sandbox.memory_limit_bytes =
      (unsigned long long)(at_least(c, "evaluator.memory_limit_gb", 0.25) * double(1ull << 30));
  o.gpu_lock = c.get_bool("evaluator.gpu_lock");
  o.gpu_memory_fraction = c.get_float("evaluator.gpu_memory_fraction");
  if (!(o.gpu_memory_fraction >= 0 && o.gpu_memory_fraction <= 1))
    throw error_at(c.source(),
                   "evaluator.gpu_memory_fraction: " + std::to_string(o.gpu_memory_fraction) + " is not in [0, 1]");
  o.reward.kind = c.get_string("evaluator.reward.kind");
  o.reward.clip = at_least(c, "evaluator.reward.clip", 0.0);
  o.reward.window = positive(c, "evaluator.reward.window", 1);
  o.reward.compile_error = c.get_float("evaluator.reward.compile_error");
  o.reward.runtime_error = c.get_float("evaluator.reward.runtime_error");
  o.reward.timeout = c.get_float("evaluator.reward.timeout");
  o.reward.incorrect = c.get_float("evaluator.reward.incorrect");
  o.reward.rejected_cheat = c.get_float("evaluator.reward.rejected_cheat");
  o.reward.ok_bonus = c.get_float("evaluator.reward.ok_bonus");
  return o;
}

}  // namespace kf::evaluator
