#include "batch.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "loss.h"

namespace kf::learner {

int64_t StepBatch::completion_tokens() const {
  int64_t n = 0;
  for (const auto& s : seqs) n += static_cast<int64_t>(s.tokens.size()) - s.prompt_len;
  return n;
}

namespace {
bool ids_in_range(const std::vector<int32_t>& ids, int64_t vocab) {
  if (vocab <= 0) return true;
  for (int32_t t : ids)
    if (t < 0 || t >= vocab) return false;
  return true;
}
}  // namespace

void shuffle_within_group(std::vector<double>& rewards, uint64_t seed, int64_t version, uint64_t group_id) {
  // splitmix64 of (seed, version, group): the same permutation on every rank and on a rerun.
  uint64_t x = seed * 0x9E3779B97F4A7C15ull ^
               (static_cast<uint64_t>(version) + 0x632BE59BD9B4E019ull) * 0xBF58476D1CE4E5B9ull ^
               group_id * 0x94D049BB133111EBull;
  auto next = [&x] {
    uint64_t z = (x += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  };
  for (std::size_t i = rewards.size(); i > 1; --i) std::swap(rewards[i - 1], rewards[next() % i]);  // Fisher-Yates
}

std::vector<double> turn_advantages(const std::vector<double>& rewards, bool std_normalize, double eps) {
  std::vector<double> a(rewards.size(), 0.0);
  if (rewards.size() < 2) return a;
  const double n = static_cast<double>(rewards.size());
  const double sum = std::accumulate(rewards.begin(), rewards.end(), 0.0);
  const double mean = sum / n;
  double var = 0;
  for (double r : rewards) var += (r - mean) * (r - mean);
  const double sd = std::sqrt(var / n);
  for (std::size_t i = 0; i < rewards.size(); ++i) {
    const double others = (sum - rewards[i]) / (n - 1);
    a[i] = std_normalize ? (rewards[i] - others) / (sd + eps) : rewards[i] - others;
  }
  return a;
}

StepBatch build_step_batch(const std::vector<replay::ScoredGroup>& groups, int64_t current_version,
                           const LearnerConfig& cfg, int64_t vocab_size) {
  StepBatch out;
  for (const auto& g : groups) {
    ++out.counts.groups_in;
    if (replay::is_probe(g)) {  // the learning-curve probe measures the policy; it is not trained on
      ++out.counts.probe_groups;
      continue;
    }
    if (current_version - g.policy_version > cfg.max_staleness) {
      ++out.counts.dropped_stale;
      continue;
    }
    std::vector<Sequence> seqs;
    bool multi_turn = false;
    for (std::size_t i = 0; i < g.candidates.size(); ++i) {
      const auto& c = g.candidates[i];
      multi_turn = multi_turn || c.turns > 1;
      // A later turn's member carries its own conversation; at turn 1 the group's prompt.
      const auto& prompt = c.prompt_tokens.empty() ? g.prompt_tokens : c.prompt_tokens;
      if (i >= g.results.size() || (i < g.missing.size() && g.missing[i])) {
        ++out.counts.candidates_missing;
        continue;
      }
      if (g.results[i].cause == replay::Cause::environment) {  // says nothing about the completion
        ++out.counts.candidates_environment;
        continue;
      }
      if (c.completion_tokens.empty() || c.behaviour_logprobs.size() != c.completion_tokens.size() || prompt.empty() ||
          !ids_in_range(prompt, vocab_size) || !ids_in_range(c.completion_tokens, vocab_size)) {
        ++out.counts.candidates_malformed;
        continue;
      }
      Sequence s;
      s.tokens = prompt;
      s.tokens.insert(s.tokens.end(), c.completion_tokens.begin(), c.completion_tokens.end());
      s.prompt_len = static_cast<int64_t>(prompt.size());
      s.behaviour = c.behaviour_logprobs;
      s.reward = g.results[i].reward;
      seqs.push_back(std::move(s));
    }
    if (seqs.size() < 2) {
      ++out.counts.skipped_small;
      continue;
    }
    std::vector<double> rewards;
    for (const auto& s : seqs) rewards.push_back(s.reward);
    if (cfg.grpo.shuffle_rewards) {
      shuffle_within_group(rewards, cfg.seed, current_version, g.group_id);
      for (std::size_t i = 0; i < seqs.size(); ++i) seqs[i].reward = rewards[i];
    }
    if (rewards_all_equal(rewards)) {
      ++out.counts.skipped_equal;
      continue;
    }
    const auto adv = multi_turn ? turn_advantages(rewards, cfg.grpo.std_normalize, cfg.grpo.adv_eps)
                                : group_advantages(rewards, cfg.grpo.std_normalize, cfg.grpo.adv_eps);
    const int64_t group_index = static_cast<int64_t>(out.groups.size());
    const int64_t base = static_cast<int64_t>(out.seqs.size());
    std::vector<int64_t> members;
    for (std::size_t i = 0; i < seqs.size(); ++i) {
      seqs[i].advantage = adv[i];
      seqs[i].group = group_index;
      members.push_back(base + static_cast<int64_t>(i));
      out.seqs.push_back(std::move(seqs[i]));
    }
    if (cfg.uses_pairwise())
      for (const auto& p : select_pairs(rewards, cfg.pairwise.pairs_per_group, cfg.pairwise.min_reward_gap))
        out.pairs.emplace_back(base + p.first, base + p.second);
    out.groups.push_back(std::move(members));
    ++out.counts.groups_used;
  }
  return out;
}

std::vector<std::vector<int64_t>> pack_micro_batches(const StepBatch& b, int64_t max_tokens) {
  std::vector<std::vector<int64_t>> out;
  std::vector<int64_t> cur;
  int64_t cur_len = 0;
  for (const auto& members : b.groups) {
    int64_t glen = 0;
    for (int64_t i : members) glen = std::max<int64_t>(glen, b.seqs[i].tokens.size());
    const int64_t len = std::max(cur_len, glen);
    const int64_t rows = static_cast<int64_t>(cur.size() + members.size());
    if (!cur.empty() && rows * len > max_tokens) {
      out.push_back(std::move(cur));
      cur.clear();
      cur_len = 0;
    }
    cur.insert(cur.end(), members.begin(), members.end());
    cur_len = std::max(cur_len, glen);
  }
  if (!cur.empty()) out.push_back(std::move(cur));
  return out;
}

namespace {

// The [B, T-1] tensors of a micro-batch from each sequence's row and start column.
MicroBatch fill_micro_batch(const StepBatch& b, const std::vector<int64_t>& seq_index, int64_t B, int64_t T,
                            const std::vector<std::pair<int64_t, int64_t>>& row_col) {
  auto ids = torch::zeros({B, T}, torch::kInt64);
  auto attn = torch::zeros({B, T}, torch::kInt64);
  auto beh = torch::zeros({B, T - 1}, torch::kFloat32);
  auto comp = torch::zeros({B, T - 1}, torch::kFloat32);
  auto adv = torch::zeros({B, T - 1}, torch::kFloat32);
  auto inv = torch::zeros({B, T - 1}, torch::kFloat32);
  auto slot = torch::zeros({B, T - 1}, torch::kInt64);
  auto ia = ids.accessor<int64_t, 2>();
  auto aa = attn.accessor<int64_t, 2>();
  auto ba = beh.accessor<float, 2>();
  auto ca = comp.accessor<float, 2>();
  auto va = adv.accessor<float, 2>();
  auto na = inv.accessor<float, 2>();
  auto sa = slot.accessor<int64_t, 2>();
  MicroBatch m;
  for (std::size_t k = 0; k < seq_index.size(); ++k) {
    const auto& s = b.seqs[seq_index[k]];
    const auto [r, c0] = row_col[k];
    for (std::size_t t = 0; t < s.tokens.size(); ++t) {
      ia[r][c0 + t] = s.tokens[t];
      aa[r][c0 + t] = 1;
    }
    // Position t predicts token t+1: completion token j (at P+j) is predicted at P-1+j.
    const float n = static_cast<float>(s.behaviour.size());
    for (std::size_t j = 0; j < s.behaviour.size(); ++j) {
      const int64_t t = c0 + s.prompt_len - 1 + static_cast<int64_t>(j);
      ba[r][t] = s.behaviour[j];
      ca[r][t] = 1.0f;
      va[r][t] = static_cast<float>(s.advantage);
      na[r][t] = 1.0f / n;
      sa[r][t] = static_cast<int64_t>(k);
    }
    m.real_tokens += static_cast<int64_t>(s.tokens.size());
  }
  m.ids = ids;
  m.attention = attn;
  m.behaviour = beh;
  m.completion = comp;
  m.advantages = adv;
  m.inv_len = inv;
  m.seq_slot = slot;
  m.seq_index = seq_index;
  return m;
}

}  // namespace

MicroBatch make_micro_batch(const StepBatch& b, const std::vector<int64_t>& seq_index) {
  const int64_t B = static_cast<int64_t>(seq_index.size());
  int64_t T = 2;
  for (int64_t i : seq_index) T = std::max<int64_t>(T, b.seqs[i].tokens.size());
  std::vector<std::pair<int64_t, int64_t>> row_col;
  for (int64_t r = 0; r < B; ++r) row_col.emplace_back(r, 0);
  return fill_micro_batch(b, seq_index, B, T, row_col);
}

std::vector<std::vector<int64_t>> pack_sequences(const StepBatch& b, int64_t max_tokens, bool whole_groups) {
  struct Unit {
    std::vector<int64_t> seqs;
    int64_t len = 0;
  };
  std::vector<Unit> units;
  for (const auto& members : b.groups) {
    if (whole_groups)
      units.push_back({members, 0});
    else
      for (int64_t i : members) units.push_back({{i}, 0});
  }
  for (auto& u : units)
    for (int64_t i : u.seqs) u.len += static_cast<int64_t>(b.seqs[i].tokens.size());
  std::stable_sort(units.begin(), units.end(), [](const Unit& x, const Unit& y) { return x.len > y.len; });
  std::vector<std::vector<int64_t>> rows;
  std::vector<int64_t> used;
  for (const auto& u : units) {
    std::size_t r = 0;
    while (r < rows.size() && used[r] + u.len > max_tokens) ++r;
    if (r == rows.size()) {
      rows.emplace_back();
      used.push_back(0);
    }
    rows[r].insert(rows[r].end(), u.seqs.begin(), u.seqs.end());
    used[r] += u.len;
  }
  return rows;
}

MicroBatch make_packed_micro_batch(const StepBatch& b, const std::vector<int64_t>& seq_index) {
  std::vector<std::pair<int64_t, int64_t>> row_col;
  std::vector<int64_t> segments;
  int64_t T = 0;
  for (int64_t i : seq_index) {
    row_col.emplace_back(0, T);
    segments.push_back(static_cast<int64_t>(b.seqs[i].tokens.size()));
    T += segments.back();
  }
  auto m = fill_micro_batch(b, seq_index, 1, std::max<int64_t>(T, 2), row_col);
  m.segments = std::move(segments);
  return m;
}

}  // namespace kf::learner
