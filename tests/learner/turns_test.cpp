// Multi-turn refinement in the learner batch (docs/learner.md, "Multi-turn refinement"): a
// two-turn conversation group goes through the real replay buffer (turn 1 opened held, read
// and released as the actor does; turn 2 with one prompt per member) and build_step_batch
// gives each turn its per-turn leave-one-out advantages, computed here from the rewards.
// The learning-curve probe's groups (held and read the same way) are never trained on.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <numeric>

#include "batch.h"
#include "kf/common/error.h"
#include "kf/replay/replay.h"

using namespace kf::learner;
namespace rp = kf::replay;
using namespace std::chrono_literals;

namespace {

struct Shm {
  std::string name = "kflturns" + std::to_string(::getpid());
  rp::ReplayBuffer rb = rp::ReplayBuffer::create(name, rp::ReplayConfig{8, 256 * 1024, 512});
  ~Shm() { rp::ShmSegment::remove(name); }
};

rp::Candidate member(uint64_t group, uint32_t index, uint32_t turn, std::vector<int32_t> prompt,
                     std::vector<int32_t> completion) {
  rp::Candidate c;
  c.id = group * 100 + index + 1;
  c.task = "t";
  c.group_id = group;
  c.index_in_group = index;
  c.turn = turn;
  c.turns = 2;
  c.prompt_tokens = std::move(prompt);
  c.completion_tokens = std::move(completion);
  for (std::size_t k = 0; k < c.completion_tokens.size(); ++k)
    c.behaviour_logprobs.push_back(-0.25f * float(turn) - 0.01f * float(index * 10 + k));
  return c;
}

void score(rp::ReplayBuffer& rb, const std::vector<rp::Candidate>& cands, const std::vector<double>& rewards) {
  for (std::size_t i = 0; i < cands.size(); ++i) {
    rp::Result r;
    r.candidate_id = cands[i].id;
    r.group_id = cands[i].group_id;
    r.index_in_group = cands[i].index_in_group;
    r.verdict = rewards[i] > 0 ? rp::Verdict::ok : rp::Verdict::compile_error;
    r.reward = rewards[i];
    ASSERT_TRUE(rb.add_result(r));
  }
}

// A_i = r_i - mean of the others' rewards (of the same turn), optionally / (std + eps).
std::vector<double> loo(const std::vector<double>& r, bool norm, double eps) {
  const double n = double(r.size()), sum = std::accumulate(r.begin(), r.end(), 0.0), mean = sum / n;
  double var = 0;
  for (double x : r) var += (x - mean) * (x - mean);
  std::vector<double> a;
  for (double x : r) a.push_back((x - (sum - x) / (n - 1)) / (norm ? std::sqrt(var / n) + eps : 1.0));
  return a;
}

}  // namespace

TEST(LearnerTurnsTest, TwoTurnGroupHasPerTurnLeaveOneOutAdvantagesAndOwnPrompts) {
  Shm shm;
  const std::vector<int32_t> p1 = {1, 2, 3, 4};
  std::vector<rp::Candidate> t1;
  for (uint32_t i = 0; i < 4; ++i) t1.push_back(member(10, i, 1, p1, {20 + int32_t(i), 30, 31}));
  ASSERT_TRUE(shm.rb.open_group(t1, 10s, 0ms, /*hold=*/true));
  const std::vector<double> r1 = {1.0, -3.0, 0.5, 2.0};
  score(shm.rb, t1, r1);
  std::vector<rp::ScoredGroup> out;
  EXPECT_EQ(shm.rb.take_ready(out, 8, 0, 100, 0ms), 0u) << "a held group must wait for the actor";
  rp::ScoredGroup seen;
  ASSERT_EQ(shm.rb.peek_group(10, &seen, /*release=*/true), rp::GroupPeek::ready);
  ASSERT_EQ(seen.results.size(), 4u);
  EXPECT_EQ(seen.results[3].reward, 2.0);

  // Turn 2: members 0, 2 and 3 go on, each with its own conversation (turn-1 prompt + its
  // answer + feedback), of different lengths.
  std::vector<rp::Candidate> t2;
  const uint32_t parents[] = {0, 2, 3};
  for (uint32_t k = 0; k < 3; ++k) {
    std::vector<int32_t> conv = p1;
    conv.insert(conv.end(), t1[parents[k]].completion_tokens.begin(), t1[parents[k]].completion_tokens.end());
    for (uint32_t f = 0; f <= k; ++f) conv.push_back(50 + int32_t(f));  // feedback
    auto c = member(11, k, 2, conv, {40 + int32_t(k), 41});
    c.parent_group_id = 10;
    c.parent_index = parents[k];
    t2.push_back(c);
  }
  ASSERT_TRUE(shm.rb.open_group(t2, 10s));
  const std::vector<double> r2 = {-3.0, 1.5, 2.5};
  score(shm.rb, t2, r2);
  ASSERT_EQ(shm.rb.take_ready(out, 8, 0, 100, 1s), 2u);
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.group_id < b.group_id; });
  ASSERT_EQ(out[1].candidates.size(), 3u);
  for (uint32_t k = 0; k < 3; ++k) {
    const auto& c = out[1].candidates[k];
    EXPECT_EQ(c.turn, 2u);
    EXPECT_EQ(c.parent_group_id, 10u);
    EXPECT_EQ(c.parent_index, parents[k]);
    const auto& prompt = c.prompt_tokens.empty() ? out[1].prompt_tokens : c.prompt_tokens;
    EXPECT_EQ(prompt, t2[k].prompt_tokens) << "member " << k << " must keep its own conversation";
  }

  for (const bool norm : {false, true}) {
    LearnerConfig cfg;
    cfg.grpo.std_normalize = norm;
    const auto b = build_step_batch(out, 0, cfg);
    ASSERT_EQ(b.counts.groups_used, 2);
    ASSERT_EQ(b.seqs.size(), 7u);
    const auto a1 = loo(r1, norm, cfg.grpo.adv_eps), a2 = loo(r2, norm, cfg.grpo.adv_eps);
    for (std::size_t i = 0; i < 4; ++i) EXPECT_NEAR(b.seqs[i].advantage, a1[i], 1e-12) << "turn 1, member " << i;
    for (std::size_t k = 0; k < 3; ++k) EXPECT_NEAR(b.seqs[4 + k].advantage, a2[k], 1e-12) << "turn 2, member " << k;
    if (!norm) {  // spelled out once: r = {1, -3, 0.5, 2}: A_0 = 1 - (-3 + 0.5 + 2) / 3
      EXPECT_NEAR(b.seqs[0].advantage, 1.0 + 0.5 / 3, 1e-12);
      EXPECT_NEAR(b.seqs[6].advantage, 2.5 - (-3.0 + 1.5) / 2, 1e-12);
    }
    // Each turn trains on its own completion; its prompt (earlier turns included) is context.
    for (std::size_t k = 0; k < 3; ++k) {
      const auto& s = b.seqs[4 + k];
      EXPECT_EQ(s.prompt_len, static_cast<int64_t>(t2[k].prompt_tokens.size()));
      EXPECT_EQ(s.behaviour, t2[k].behaviour_logprobs) << "importance ratios use this turn's own behaviour";
      const auto m = make_micro_batch(b, {static_cast<int64_t>(4 + k)});
      EXPECT_EQ(m.completion.sum().item<float>(), 2.0f);
      // Position prompt_len - 1 predicts the first completion token; nothing before it counts.
      EXPECT_EQ(m.completion[0].narrow(0, 0, s.prompt_len - 1).sum().item<float>(), 0.0f);
      EXPECT_EQ(m.completion[0][s.prompt_len - 1].item<float>(), 1.0f);
      EXPECT_FLOAT_EQ(m.advantages[0][s.prompt_len - 1].item<float>(), static_cast<float>(a2[k]));
    }
  }
}

TEST(LearnerTurnsTest, SingleTurnGroupsKeepGroupMeanAdvantages) {
  // turns == 1 (the default): the GRPO advantage r - mean, as before multi-turn existed.
  rp::ScoredGroup g;
  g.prompt_tokens = {1, 2};
  const std::vector<double> r = {1.0, -3.0, 0.5, 2.0};
  for (std::size_t i = 0; i < r.size(); ++i) {
    rp::Candidate c;
    c.completion_tokens = {7, 8};
    c.behaviour_logprobs = {-1.0f, -2.0f};
    rp::Result res;
    res.reward = r[i];
    g.candidates.push_back(c);
    g.results.push_back(res);
    g.missing.push_back(0);
  }
  LearnerConfig cfg;
  const auto b = build_step_batch({g}, 0, cfg);
  ASSERT_EQ(b.seqs.size(), 4u);
  const double mean = 0.125;
  for (std::size_t i = 0; i < r.size(); ++i) EXPECT_DOUBLE_EQ(b.seqs[i].advantage, r[i] - mean);
}

TEST(LearnerTurnsTest, LeaveOneOutOfOneMemberIsZero) {
  EXPECT_EQ(turn_advantages({2.0}, false, 1e-6), std::vector<double>({0.0}));
  EXPECT_EQ(turn_advantages({}, true, 1e-6).size(), 0u);
  const auto a = turn_advantages({1.0, 3.0}, false, 1e-6);
  EXPECT_DOUBLE_EQ(a[0], -2.0);
  EXPECT_DOUBLE_EQ(a[1], 2.0);
}

TEST(LearnerTurnsTest, CandidateRecordsOfTheSingleTurnFormatStillDecode) {
  rp::Candidate c = member(5, 1, 2, {1, 2}, {3, 4});
  c.parent_group_id = 4;
  c.parent_index = 3;
  std::vector<unsigned char> buf(rp::encoded_size(c));
  rp::encode(c, buf.data());
  const auto back = rp::decode_candidate(buf.data(), buf.size());
  EXPECT_EQ(back.turn, 2u);
  EXPECT_EQ(back.turns, 2u);
  EXPECT_EQ(back.parent_group_id, 4u);
  EXPECT_EQ(back.parent_index, 3u);
  // Version 1 (no turn fields): the same bytes without the last 21 (the turn fields, then
  // version 3's probe byte), version word 1.
  std::vector<unsigned char> v1(buf.begin(), buf.end() - 21);
  const uint32_t one = 1;
  std::memcpy(v1.data() + 4, &one, 4);
  const auto old = rp::decode_candidate(v1.data(), v1.size());
  EXPECT_EQ(old.turn, 1u);
  EXPECT_EQ(old.turns, 1u);
  EXPECT_EQ(old.parent_group_id, 0u);
  EXPECT_EQ(old.completion_tokens, c.completion_tokens);
  // A turn outside 1..turns is refused, naming the field.
  c.turn = 3;
  rp::encode(c, buf.data());
  try {
    rp::decode_candidate(buf.data(), buf.size(), "test");
    ADD_FAILURE() << "turn 3 of 2 decoded";
  } catch (const kf::Error& e) {
    EXPECT_NE(std::string(e.what()).find("turn"), std::string::npos) << e.what();
  }
}

// The actors' learning-curve probe (actors.probe): a probe group travels the real replay
// buffer as actor 0 handles it (opened held, scored, read and released), and the learner
// takes it with a group to train on. build_step_batch counts it and leaves it out: none of
// its tokens reach the batch, even though its rewards differ (a group it would train on).
TEST(LearnerBatchTest, ProbeGroupsAreCountedAndNeverTrainedOn) {
  Shm shm;
  auto single = [](uint64_t group, uint32_t index, bool probe) {
    rp::Candidate c = member(group, index, 1, {1, 2, 3}, {40 + int32_t(group), 41, int32_t(index)});
    c.turns = 1;
    c.probe = probe;
    return c;
  };
  std::vector<rp::Candidate> probe, train;
  for (uint32_t i = 0; i < 3; ++i) probe.push_back(single(20, i, true));
  for (uint32_t i = 0; i < 3; ++i) train.push_back(single(21, i, false));
  ASSERT_TRUE(shm.rb.open_group(probe, 10s, 0ms, /*hold=*/true));
  ASSERT_TRUE(shm.rb.open_group(train, 10s, 0ms));
  score(shm.rb, probe, {1.0, -3.0, 0.5});
  score(shm.rb, train, {2.0, -3.0, 1.0});
  rp::ScoredGroup seen;
  ASSERT_EQ(shm.rb.peek_group(20, &seen, /*release=*/true), rp::GroupPeek::ready);
  std::vector<rp::ScoredGroup> taken;
  ASSERT_EQ(shm.rb.take_ready(taken, 8, 0, 100, 0ms), 2u);
  std::size_t probes = 0;
  for (const auto& g : taken) probes += rp::is_probe(g) ? 1 : 0;
  EXPECT_EQ(probes, 1u) << "the probe flag travels in the group's candidate records";

  LearnerConfig cfg;
  const auto b = build_step_batch(taken, 0, cfg);
  EXPECT_EQ(b.counts.groups_in, 2);
  EXPECT_EQ(b.counts.probe_groups, 1);
  EXPECT_EQ(b.counts.groups_used, 1);
  EXPECT_EQ(b.counts.skipped_equal, 0);
  ASSERT_EQ(b.seqs.size(), 3u);
  for (const auto& s : b.seqs) EXPECT_EQ(s.tokens[3], 40 + 21) << "a probe completion reached the batch";
  // The same group without the flag is trained on.
  for (auto& g : taken)
    for (auto& c : g.candidates) c.probe = false;
  const auto all = build_step_batch(taken, 0, cfg);
  EXPECT_EQ(all.counts.probe_groups, 0);
  EXPECT_EQ(all.counts.groups_used, 2);
  EXPECT_EQ(all.seqs.size(), 6u);
}
