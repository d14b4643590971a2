// SyntheticSource: the deterministic group stream of tests and benchmarks (a
// replay::ReadyGroups; a run's groups come from kf::transport::open_ready_groups).
#include "kf/learner/learner.h"

#include <random>

namespace kf::learner {

replay::ScoredGroup SyntheticSource::make_group(int64_t step, int64_t k, int64_t version, int64_t max_lag) const {
  std::mt19937_64 rng(cfg_.seed * 0x9E3779B97F4A7C15ULL + static_cast<uint64_t>(step) * 1000003ULL +
                      static_cast<uint64_t>(k));
  auto uni = [&](int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(rng); };
  std::normal_distribution<double> noise(0.0, cfg_.behaviour_noise);
  replay::ScoredGroup g;
  g.group_id = static_cast<uint64_t>(step) * 100000 + static_cast<uint64_t>(k);
  g.task = "synthetic_" + std::to_string(k % 7);
  const int64_t global = step * groups_per_step_total + k;
  g.policy_version = version;
  if (cfg_.stale_every > 0 && global % cfg_.stale_every == cfg_.stale_every - 1)
    g.policy_version = version - max_lag - 1;
  const int64_t plen = uni(cfg_.prompt_min, cfg_.prompt_max);
  for (int64_t i = 0; i < plen; ++i) g.prompt_tokens.push_back(static_cast<int32_t>(uni(0, cfg_.vocab - 1)));
  const bool equal = cfg_.equal_reward_every > 0 && global % cfg_.equal_reward_every == cfg_.equal_reward_every - 1;
  for (int64_t i = 0; i < cfg_.group_size; ++i) {
    replay::Candidate c;
    c.id = g.group_id * 64 + static_cast<uint64_t>(i);
    c.task = g.task;
    c.group_id = g.group_id;
    c.index_in_group = static_cast<uint32_t>(i);
    c.policy_version = g.policy_version;
    const int64_t clen = uni(cfg_.completion_min, cfg_.completion_max);
    for (int64_t j = 0; j < clen; ++j) {
      c.completion_tokens.push_back(static_cast<int32_t>(uni(0, cfg_.vocab - 1)));
      c.behaviour_logprobs.push_back(static_cast<float>(cfg_.behaviour_logprob + noise(rng)));
    }
    replay::Result res;
    res.candidate_id = c.id;
    res.group_id = g.group_id;
    res.index_in_group = c.index_in_group;
    res.verdict = replay::Verdict::ok;
    res.speedup = equal ? 1.0 : 0.5 + 0.25 * static_cast<double>(uni(0, 8));
    res.reward = res.speedup - 1.0;
    g.candidates.push_back(std::move(c));
    g.results.push_back(res);
    g.missing.push_back(0);
  }
  return g;
}

std::vector<replay::ScoredGroup> SyntheticSource::take(const replay::TakeRequest& r) {
  std::vector<replay::ScoredGroup> out;
  for (int64_t k = r.rank; k < groups_per_step_total; k += r.world)
    out.push_back(make_group(r.step, k, r.version, r.max_lag));
  return out;
}

}  // namespace kf::learner
