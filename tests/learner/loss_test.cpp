// The objectives on hand-computed cases: advantages, clipping (symmetric and
// clip-higher), masks, token vs sequence aggregation, KL, decoupled weights, pairwise,
// and the batch builder (staleness drop, no-signal skip, missing results, alignment);
// the chunked head (log-probs and gradients equal to the full softmax, less peak memory);
// layer recomputation (under the forward's autocast; on by size, same update, less memory).
#include <gtest/gtest.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/impl/alloc_cpu.h>

#include <atomic>
#include <functional>
#include <mutex>
#include <unordered_map>
#include <cmath>

#include <ATen/autocast_mode.h>

#include "../counting_allocator.h"  // defines: kf::test::CountingCpuAllocator
#include "batch.h"
#include "kf/learner/learner.h"
#include "kf/policy/policy.h"
#include "loss.h"

using namespace kf::learner;

namespace {
torch::Tensor t2(std::vector<float> v, int64_t b, int64_t t) { return torch::tensor(v).view({b, t}); }
}  // namespace

TEST(LearnerLossTest, AdvantagesAreMeanCentredAndOptionallyStdNormalised) {
  const auto a = group_advantages({1, 2, 3, 6}, false, 0);
  EXPECT_DOUBLE_EQ(a[0], -2);
  EXPECT_DOUBLE_EQ(a[1], -1);
  EXPECT_DOUBLE_EQ(a[2], 0);
  EXPECT_DOUBLE_EQ(a[3], 3);
  const auto n = group_advantages({1, 2, 3, 6}, true, 0);
  const double sd = std::sqrt(3.5);  // population std: (4 + 1 + 0 + 9) / 4
  EXPECT_NEAR(n[0], -2 / sd, 1e-12);
  EXPECT_NEAR(n[3], 3 / sd, 1e-12);
  EXPECT_TRUE(rewards_all_equal({0.5, 0.5, 0.5}));
  EXPECT_TRUE(rewards_all_equal({0.5}));
  EXPECT_FALSE(rewards_all_equal({0.5, 0.5, 0.25}));
}

TEST(LearnerLossTest, PositiveAdvantageRatioAboveClipIsClippedWithNoGradient) {
  GrpoConfig cfg;  // clip 0.2 / 0.2
  auto logp = torch::tensor({std::log(1.5f)}).view({1, 1}).requires_grad_(true);
  const auto beh = torch::zeros({1, 1});
  const auto out = grpo_loss(logp, beh, {}, torch::tensor({1.0f}), torch::ones({1, 1}), cfg);
  EXPECT_NEAR(out.loss.item<double>(), -1.2, 1e-6);  // -min(1.5 * 1, 1.2 * 1)
  EXPECT_NEAR(out.clipped.item<double>(), 1.0, 1e-12);
  out.loss.backward();
  EXPECT_NEAR(logp.grad().item<double>(), 0.0, 1e-12);
}

TEST(LearnerLossTest, NegativeAdvantageRatioAboveClipKeepsTheUnclippedGradient) {
  GrpoConfig cfg;
  auto logp = torch::tensor({std::log(1.5f)}).view({1, 1}).requires_grad_(true);
  const auto out = grpo_loss(logp, torch::zeros({1, 1}), {}, torch::tensor({-1.0f}), torch::ones({1, 1}), cfg);
  EXPECT_NEAR(out.loss.item<double>(), 1.5, 1e-6);  // -min(-1.5, -1.2)
  out.loss.backward();
  EXPECT_NEAR(logp.grad().item<double>(), 1.5, 1e-6);  // d/dlogp of -A * exp(logp - beh) = -A * r
  // Below the low clip with A < 0: ratio 0.5 clipped to 0.8, -min(-0.5, -0.8) = 0.8, no gradient.
  auto lo = torch::tensor({std::log(0.5f)}).view({1, 1}).requires_grad_(true);
  const auto o2 = grpo_loss(lo, torch::zeros({1, 1}), {}, torch::tensor({-1.0f}), torch::ones({1, 1}), cfg);
  EXPECT_NEAR(o2.loss.item<double>(), 0.8, 1e-6);
  o2.loss.backward();
  EXPECT_NEAR(lo.grad().item<double>(), 0.0, 1e-12);
}

TEST(LearnerLossTest, ClipHigherLetsAPositiveRatioGrowFurther) {
  GrpoConfig sym, dapo;
  dapo.clip_high = 0.28;
  const auto logp = torch::tensor({std::log(1.25f)}).view({1, 1});
  const auto A = torch::tensor({1.0f});
  EXPECT_NEAR(grpo_loss(logp, torch::zeros({1, 1}), {}, A, torch::ones({1, 1}), sym).loss.item<double>(), -1.2, 1e-6);
  EXPECT_NEAR(grpo_loss(logp, torch::zeros({1, 1}), {}, A, torch::ones({1, 1}), dapo).loss.item<double>(), -1.25, 1e-6);
}

TEST(LearnerLossTest, MaskedTokensContributeNothing) {
  GrpoConfig cfg;
  auto logp = t2({0.0f, 5.0f, 0.0f}, 1, 3).requires_grad_(true);  // a huge ratio on the masked token
  const auto w = t2({0.5f, 0.0f, 0.5f}, 1, 3);
  const auto out = grpo_loss(logp, torch::zeros({1, 3}), {}, torch::tensor({2.0f}), w, cfg);
  EXPECT_NEAR(out.loss.item<double>(), -2.0, 1e-6);  // ratio 1 on both real tokens, A = 2
  out.loss.backward();
  EXPECT_EQ(logp.grad()[0][1].item<float>(), 0.0f);
  EXPECT_NEAR(logp.grad()[0][0].item<double>(), -1.0, 1e-6);  // -w * A * r = -0.5 * 2
}

TEST(LearnerLossTest, TokenAndSequenceAggregationWeighDifferently) {
  // Sequence 0: 1 token, A = +1; sequence 1: 3 tokens, A = -1; all ratios 1.
  GrpoConfig cfg;
  const auto logp = torch::zeros({2, 3});
  const auto mask = t2({1, 0, 0, 1, 1, 1}, 2, 3);
  const auto A = torch::tensor({1.0f, -1.0f});
  const auto token = grpo_loss(logp, torch::zeros({2, 3}), {}, A, mask / 4.0, cfg);
  EXPECT_NEAR(token.loss.item<double>(), -(1.0 - 3.0) / 4.0, 1e-6);  // 0.5
  const auto seq_w = mask / mask.sum(1, true) / 2.0;
  const auto seq = grpo_loss(logp, torch::zeros({2, 3}), {}, A, seq_w, cfg);
  EXPECT_NEAR(seq.loss.item<double>(), 0.0, 1e-6);
}

TEST(LearnerLossTest, KlTermIsTheK3EstimatorTimesItsCoefficient) {
  GrpoConfig cfg;
  cfg.kl_coef = 0.5;
  const auto logp = torch::full({1, 1}, -1.0f);
  const auto ref = torch::full({1, 1}, -1.5f);
  const auto out = grpo_loss(logp, logp.clone(), ref, torch::tensor({0.0f}), torch::ones({1, 1}), cfg);
  const double k3 = std::exp(-0.5) + 0.5 - 1.0;
  EXPECT_NEAR(out.kl.item<double>(), k3, 1e-6);
  EXPECT_NEAR(out.loss.item<double>(), 0.5 * k3, 1e-6);
}

TEST(LearnerLossTest, DecoupledWeightsStaleSamplesByCappedBehaviourRatio) {
  GrpoConfig cfg;
  cfg.ratio = RatioMode::decoupled;
  cfg.behaviour_weight_cap = 1.5;
  auto logp = torch::full({1, 2}, -1.0f).requires_grad_(true);
  // Token 0: pi_prox / pi_behaviour = 2 (capped to 1.5); token 1: 0.5.
  const auto beh = torch::tensor({-1.0f - std::log(2.0f), -1.0f + std::log(2.0f)}).view({1, 2});
  const auto out = grpo_loss(logp, beh, {}, torch::tensor({1.0f}), torch::ones({1, 2}), cfg);
  EXPECT_NEAR(out.loss.item<double>(), -(1.5 + 0.5), 1e-5);
  out.loss.backward();
  EXPECT_NEAR(logp.grad()[0][0].item<double>(), -1.5, 1e-5);
  EXPECT_NEAR(logp.grad()[0][1].item<double>(), -0.5, 1e-5);
}

TEST(LearnerLossTest, PairwiseIsLogisticOnTheReferenceRelativeMargin) {
  auto lp = torch::tensor({-1.0f, -3.0f}).requires_grad_(true);
  const auto ref = torch::tensor({-2.0f, -2.0f});
  const auto loss = pairwise_loss(lp, ref, {{0, 1}}, 0.1, 1.0);
  // margin = (-1 + 2) - (-3 + 2) = 2; -log sigmoid(0.2) = log(1 + exp(-0.2))
  EXPECT_NEAR(loss.item<double>(), std::log1p(std::exp(-0.2)), 1e-6);
  loss.backward();
  const double g = -0.1 / (1.0 + std::exp(0.2));  // -beta * sigmoid(-beta * margin)
  EXPECT_NEAR(lp.grad()[0].item<double>(), g, 1e-6);
  EXPECT_NEAR(lp.grad()[1].item<double>(), -g, 1e-6);
}

TEST(LearnerLossTest, PairsMatchBestWithWorstAboveTheGap) {
  const auto p = select_pairs({0.1, 0.9, 0.5, 0.3}, 4, 0.0);
  ASSERT_EQ(p.size(), 2u);
  EXPECT_EQ(p[0], (std::pair<int64_t, int64_t>{1, 0}));
  EXPECT_EQ(p[1], (std::pair<int64_t, int64_t>{2, 3}));
  EXPECT_EQ(select_pairs({0.1, 0.9, 0.5, 0.3}, 4, 0.3).size(), 1u);
  EXPECT_EQ(select_pairs({0.1, 0.9, 0.5, 0.3}, 1, 0.0).size(), 1u);
  EXPECT_TRUE(select_pairs({0.2, 0.2}, 4, 0.0).empty());
}

namespace {
kf::replay::ScoredGroup group(int64_t version, std::vector<double> rewards, int64_t prompt = 2) {
  kf::replay::ScoredGroup g;
  g.policy_version = version;
  for (int64_t i = 0; i < prompt; ++i) g.prompt_tokens.push_back(static_cast<int32_t>(5 + i));
  for (std::size_t i = 0; i < rewards.size(); ++i) {
    kf::replay::Candidate c;
    c.completion_tokens = {7, 8, 9};
    c.behaviour_logprobs = {-1.0f, -2.0f, -3.0f};
    kf::replay::Result r;
    r.reward = rewards[i];
    g.candidates.push_back(c);
    g.results.push_back(r);
    g.missing.push_back(0);
  }
  return g;
}
}  // namespace

TEST(LearnerBatchTest, DropsStaleSkipsEqualAndLeavesOutMissing) {
  LearnerConfig cfg;
  cfg.max_staleness = 2;
  auto with_missing = group(9, {1, 0, 5});
  with_missing.missing[2] = 1;  // its reward 5 must not count
  const auto b = build_step_batch({group(7, {1, 0}), group(8, {1, 0}), group(10, {0.5, 0.5}), with_missing}, 10, cfg);
  EXPECT_EQ(b.counts.groups_in, 4);
  EXPECT_EQ(b.counts.dropped_stale, 1);  // 10 - 7 > 2
  EXPECT_EQ(b.counts.skipped_equal, 1);
  EXPECT_EQ(b.counts.candidates_missing, 1);
  EXPECT_EQ(b.counts.groups_used, 2);
  ASSERT_EQ(b.seqs.size(), 4u);
  EXPECT_DOUBLE_EQ(b.seqs[0].advantage, 0.5);
  EXPECT_DOUBLE_EQ(b.seqs[1].advantage, -0.5);
  EXPECT_DOUBLE_EQ(b.seqs[2].advantage, 0.5);  // mean over the two with results
  EXPECT_EQ(b.completion_tokens(), 12);
}

// The placebo arm: rewards permuted within each group, reproducibly, so that the update
// keeps its size and loses its signal.
TEST(LearnerBatchTest, ShuffledRewardsArePermutedWithinEachGroupReproducibly) {
  LearnerConfig cfg;
  cfg.grpo.shuffle_rewards = true;
  cfg.seed = 7;
  std::vector<kf::replay::ScoredGroup> gs;
  for (int i = 0; i < 64; ++i) {
    gs.push_back(group(3, {1, 0, 0, 0}));
    gs.back().group_id = 100 + static_cast<uint64_t>(i);
  }
  const auto a = build_step_batch(gs, 3, cfg), b = build_step_batch(gs, 3, cfg);
  ASSERT_EQ(a.seqs.size(), 256u);
  std::vector<int> first_at(4, 0);
  for (std::size_t g = 0; g < 64; ++g) {
    double sum = 0;
    int best = -1;
    for (std::size_t i = 0; i < 4; ++i) {
      const auto& s = a.seqs[4 * g + i];
      sum += s.reward;
      if (s.reward == 1) best = static_cast<int>(i);
      EXPECT_EQ(s.reward, b.seqs[4 * g + i].reward);   // the same draw on a rerun (and on every rank)
      EXPECT_DOUBLE_EQ(s.advantage, s.reward - 0.25);  // advantages of the shuffled rewards
    }
    EXPECT_DOUBLE_EQ(sum, 1.0);  // a permutation: the group's rewards, reordered
    ASSERT_GE(best, 0);
    ++first_at[static_cast<std::size_t>(best)];
  }
  // The best reward lands on every member (each about 16 of 64 times), not on the one that earned it.
  for (int n : first_at) EXPECT_GE(n, 6) << "a member got the best reward " << n << " of 64 times";
  EXPECT_LT(first_at[0], 32);
  // Other seeds or steps draw other permutations.
  cfg.seed = 8;
  const auto c = build_step_batch(gs, 3, cfg);
  int differ = 0;
  for (std::size_t i = 0; i < a.seqs.size(); ++i) differ += a.seqs[i].reward != c.seqs[i].reward;
  EXPECT_GT(differ, 40);
  // Off (the default): rewards stay with the completions that earned them.
  cfg.grpo.shuffle_rewards = false;
  const auto d = build_step_batch(gs, 3, cfg);
  for (std::size_t g = 0; g < 64; ++g) EXPECT_EQ(d.seqs[4 * g].reward, 1.0);
}

TEST(LearnerBatchTest, VerdictsTheMachineCausedAreLeftOut) {
  LearnerConfig cfg;
  auto g = group(0, {1, 0, -3});
  g.results[2].verdict = kf::replay::Verdict::runtime_error;
  g.results[2].cause = kf::replay::Cause::environment;
  g.results[2].reason = "out of GPU memory on 3 tries: ...";
  auto crash = group(0, {1, 0, -3});
  crash.results[2].verdict = kf::replay::Verdict::runtime_error;
  crash.results[2].reason = "crashed: worker killed by signal 11";  // the kernel's doing: it counts
  const auto b = build_step_batch({g, crash}, 0, cfg);
  EXPECT_EQ(b.counts.candidates_environment, 1);
  ASSERT_EQ(b.seqs.size(), 5u);
  EXPECT_DOUBLE_EQ(b.seqs[0].advantage, 0.5);  // the out-of-memory -3 does not pull the mean down
  EXPECT_DOUBLE_EQ(b.seqs[1].advantage, -0.5);
  EXPECT_DOUBLE_EQ(b.seqs[4].reward, -3);
  EXPECT_EQ(crash.results[2].cause, kf::replay::Cause::kernel);
}

TEST(LearnerBatchTest, TokenIdsOutsideTheVocabAreMalformedNotFatal) {
  LearnerConfig cfg;
  auto g = group(0, {1, 0, 2});
  g.candidates[2].completion_tokens[1] = 300;
  const auto b = build_step_batch({g}, 0, cfg, 256);
  EXPECT_EQ(b.counts.candidates_malformed, 1);
  EXPECT_EQ(b.seqs.size(), 2u);
}

TEST(LearnerBatchTest, MicroBatchAlignsBehaviourWithTokenLogprobs) {
  LearnerConfig cfg;
  const auto b = build_step_batch({group(0, {1, 0}, 2)}, 0, cfg);
  const auto mb = make_micro_batch(b, {0, 1});
  ASSERT_EQ(mb.ids.size(1), 5);  // 2 prompt + 3 completion
  // token_logprobs position t predicts token t+1: completion tokens 2..4 -> positions 1..3.
  EXPECT_EQ(mb.completion[0][0].item<float>(), 0.0f);
  EXPECT_EQ(mb.completion[0][1].item<float>(), 1.0f);
  EXPECT_EQ(mb.behaviour[0][1].item<float>(), -1.0f);
  EXPECT_EQ(mb.behaviour[0][3].item<float>(), -3.0f);
  EXPECT_EQ(mb.ids[0][2].item<int64_t>(), 7);
}

TEST(LearnerBatchTest, PacksGroupsWithinTheTokenBudget) {
  LearnerConfig cfg;
  std::vector<kf::replay::ScoredGroup> gs;
  for (int i = 0; i < 5; ++i) gs.push_back(group(0, {1, 0}, 3));  // 2 rows x 6 tokens = 12 per group
  const auto b = build_step_batch(gs, 0, cfg);
  const auto mbs = pack_micro_batches(b, 25);
  ASSERT_EQ(mbs.size(), 3u);  // 2 + 2 + 1 groups
  EXPECT_EQ(mbs[0].size(), 4u);
  EXPECT_EQ(mbs[2].size(), 2u);
  EXPECT_EQ(pack_micro_batches(b, 1).size(), 5u);  // a group over budget is its own micro-batch
}

// ---- chunked head: log-probs only where wanted, the vocabulary projection in chunks ----

namespace {

// Full-softmax reference: log p(target) and the exact entropy, fp32.
std::pair<torch::Tensor, torch::Tensor> full_softmax(const torch::Tensor& h, const torch::Tensor& w,
                                                     const torch::Tensor& tgt, double temperature) {
  const auto z = torch::matmul(h, w.t()) / temperature;
  const auto ls = torch::log_softmax(z, -1);
  return {ls.gather(1, tgt.unsqueeze(1)).squeeze(1), -(ls.exp() * ls).sum(-1)};
}

}  // namespace

TEST(LearnerChunkedHeadTest, LogprobsEntropyAndGradientsEqualTheFullSoftmaxForAnyChunk) {
  torch::manual_seed(3);
  const int64_t N = 37, H = 16, V = 50;
  const auto h0 = torch::randn({N, H}), w0 = torch::randn({V, H}) * 0.5;
  const auto tgt = torch::randint(0, V, {N}, torch::kInt64);
  const auto coef = torch::randn({N});  // a loss that weighs every row differently
  // The reference is the full softmax in fp64: both fp32 paths are compared with the exact
  // values, so the bound does not depend on how the BLAS of this machine and thread count
  // happens to round the fp32 reference (an fp32-vs-fp32 comparison failed on d/dW, chunk 1,
  // T 0.7 in a fresh-clone run).
  const auto f64 = torch::kFloat64;
  for (double temperature : {1.0, 0.7}) {
    auto hr = h0.to(f64).requires_grad_(true), wr = w0.to(f64).requires_grad_(true);
    const auto [lp_ref, ent_ref] = full_softmax(hr, wr, tgt, temperature);
    (lp_ref * coef.to(f64)).sum().backward();
    for (int64_t chunk : {1, 5, 8, 36, 37, 100}) {  // 5 and 8 do not divide 37
      auto h = h0.clone().requires_grad_(true), w = w0.clone().requires_grad_(true);
      const auto r = kf::policy::chunked_logprobs(h, w, tgt, temperature, chunk);
      // fp32 against exact: a few ulps of values of size ~log V, and sums of N = 37 terms for d/dW.
      const auto near = [](const torch::Tensor& got, const torch::Tensor& want, double rtol, double atol) {
        return torch::allclose(got.to(torch::kFloat64), want, rtol, atol);
      };
      EXPECT_TRUE(near(r.logp, lp_ref, 1e-5, 5e-6)) << "chunk " << chunk << " T " << temperature;
      // Entropy = lse - sum p z: fp32 rounding of two terms of size ~log V.
      EXPECT_TRUE(near(r.entropy, ent_ref, 1e-5, 2e-5))
          << "chunk " << chunk << " max diff " << (r.entropy.to(f64) - ent_ref).abs().max().item<double>();
      EXPECT_FALSE(r.entropy.requires_grad());
      (r.logp * coef).sum().backward();
      EXPECT_TRUE(near(h.grad(), hr.grad(), 1e-5, 5e-6))
          << "d/dh, chunk " << chunk << " T " << temperature << " max diff "
          << (h.grad().to(f64) - hr.grad()).abs().max().item<double>();
      EXPECT_TRUE(near(w.grad(), wr.grad(), 1e-5, 5e-6))
          << "d/dW, chunk " << chunk << " T " << temperature << " max diff "
          << (w.grad().to(f64) - wr.grad()).abs().max().item<double>();
    }
  }
  // A frozen weight (LoRA base) gets no gradient and h still does.
  auto h = h0.clone().requires_grad_(true);
  const auto r = kf::policy::chunked_logprobs(h, w0, tgt, 1.0, 4);
  r.logp.sum().backward();
  EXPECT_TRUE(h.grad().defined());
}

TEST(LearnerChunkedHeadTest, SelectedLogprobsEqualTokenLogprobsAtTheWantedPositionsWithTheSameGradients) {
  auto mc = kf::policy::named_model_shape("tiny");
  const auto f32 = torch::TensorOptions().dtype(torch::kFloat32);
  auto a = kf::policy::CausalLM(mc, f32), b = kf::policy::CausalLM(mc, f32);
  a->init_random(9);
  b->init_random(9);
  torch::manual_seed(4);
  const int64_t B = 3, T = 14;
  const auto ids = torch::randint(0, mc.vocab_size, {B, T}, torch::kInt64);
  auto attn = torch::ones({B, T}, torch::kInt64);
  attn[2].narrow(0, 10, 4).zero_();  // right padding on one row
  // Completion positions: from each row's prompt end to its last real token.
  auto wanted = torch::zeros({B, T - 1});
  wanted[0].narrow(0, 5, 8).fill_(1);
  wanted[1].narrow(0, 9, 4).fill_(1);
  wanted[2].narrow(0, 3, 6).fill_(1);
  const auto coef = torch::randn({B, T - 1});
  const auto full = a->token_logprobs(ids, attn, 0.8);
  (full * wanted * coef).sum().backward();
  for (int64_t chunk : {1, 3, 7, 64}) {
    b->zero_grad();
    const auto r = b->selected_logprobs(ids, attn, wanted, 0.8, chunk);
    EXPECT_TRUE(torch::allclose(r.logp, full * wanted, 1e-5, 1e-6)) << "chunk " << chunk;
    EXPECT_EQ((r.logp * (1 - wanted)).abs().sum().item<double>(), 0.0) << "values outside the wanted positions";
    EXPECT_GT((r.entropy * wanted).min().item<double>() + 1e-3, 0.0);
    (r.logp * coef).sum().backward();
    auto pa = a->named_parameters();
    for (const auto& p : b->named_parameters())
      EXPECT_TRUE(torch::allclose(p.value().grad(), pa[p.key()].grad(), 1e-4, 1e-5))
          << p.key() << " chunk " << chunk << " max diff "
          << (p.value().grad() - pa[p.key()].grad()).abs().max().item<double>() << " of max "
          << pa[p.key()].grad().abs().max().item<double>();
  }
}

using kf::test::CountingCpuAllocator;

TEST(LearnerChunkedHeadTest, ChunkedHeadPeaksLowerThanFullLogitsInAForwardBackward) {
  auto mc = kf::policy::named_model_shape("tiny");
  mc.vocab_size = 8192;  // the head dominates, as with a real vocabulary
  mc.num_hidden_layers = 1;
  auto m = kf::policy::CausalLM(mc, torch::TensorOptions().dtype(torch::kFloat32));
  m->init_random(2);
  const int64_t T = 256, prompt = 192;
  torch::manual_seed(6);
  const auto ids = torch::randint(0, mc.vocab_size, {1, T}, torch::kInt64);
  auto wanted = torch::zeros({1, T - 1});
  wanted[0].narrow(0, prompt - 1, T - prompt).fill_(1);
  auto& counter = CountingCpuAllocator::get();
  const int64_t full = counter.peak_during([&] {
    m->zero_grad();
    (m->token_logprobs(ids) * wanted).sum().backward();
  });
  const int64_t chunked = counter.peak_during([&] {
    m->zero_grad();
    m->selected_logprobs(ids, {}, wanted, 1.0, 16).logp.sum().backward();
  });
  const int64_t logits_bytes = (T - 1) * mc.vocab_size * 4;
  std::printf("peak bytes above the start: full logits %lld, chunked %lld ([T x V] fp32 = %lld)\n",
              static_cast<long long>(full), static_cast<long long>(chunked), static_cast<long long>(logits_bytes));
  EXPECT_GT(full, logits_bytes) << "the counter did not see the full logits";
  EXPECT_LT(chunked + logits_bytes / 2, full) << "chunking did not lower the peak by half the full logits";
}

// ---- layer recomputation ----

namespace {
// CPU bf16 autocast, standing in for CUDA's, for one scope: off again even if the scope
// throws (later tests run in fp32).
struct CpuBf16Autocast {
  CpuBf16Autocast() {
    at::autocast::set_autocast_enabled(at::kCPU, true);
    at::autocast::set_autocast_dtype(at::kCPU, at::kBFloat16);
    at::autocast::increment_nesting();
  }
  ~CpuBf16Autocast() {
    if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
    at::autocast::set_autocast_enabled(at::kCPU, false);
  }
};
}  // namespace

TEST(LearnerMemoryTest, RecomputedLayersRunUnderTheForwardsAutocastState) {
  // CPU autocast stands in for CUDA's: the forward runs in bf16, backward is called
  // outside the autocast region (as the learner does), so a recompute that ignored the
  // forward's state would rebuild the activations in fp32 and give other gradients.
  auto mc = kf::policy::named_model_shape("tiny");
  const auto f32 = torch::TensorOptions().dtype(torch::kFloat32);
  auto plain = kf::policy::CausalLM(mc, f32), ckpt = kf::policy::CausalLM(mc, f32);
  plain->init_random(5);
  ckpt->init_random(5);
  ckpt->set_gradient_checkpointing(true);
  torch::manual_seed(8);
  const auto ids = torch::randint(0, mc.vocab_size, {2, 16}, torch::kInt64);
  const auto coef = torch::randn({2, 15});
  for (auto* m : {&plain, &ckpt}) {
    torch::Tensor loss;
    {
      CpuBf16Autocast on;
      loss = ((*m)->token_logprobs(ids) * coef).sum();
    }
    loss.backward();
  }
  auto pp = plain->named_parameters();
  double worst = 0;
  for (const auto& p : ckpt->named_parameters()) {
    ASSERT_TRUE(p.value().grad().defined() && pp[p.key()].grad().defined()) << p.key() << " has no gradient";
    const auto d = (p.value().grad() - pp[p.key()].grad()).abs().max().item<double>();
    const auto scale = pp[p.key()].grad().abs().max().item<double>();
    worst = std::max(worst, d / std::max(scale, 1e-12));
  }
  // bf16 activations recomputed in fp32 differ by ~1e-2 relative; the same ops, not at all.
  EXPECT_LT(worst, 1e-5) << "recomputed layers did not run under the forward's autocast";
}

namespace {
// Two learner steps of the tiny model (2 decoder layers) on long rows, where activations
// dominate its weights, with `tweak` applied to the config: the CPU allocator's peak during
// the first step, and the weights' checksum after both.
uint64_t memory_run(const std::function<void(LearnerConfig&)>& tweak, int64_t* peak) {
  SyntheticConfig sc;
  sc.seed = 4;
  sc.prompt_min = sc.prompt_max = 160;
  sc.completion_min = sc.completion_max = 96;
  sc.equal_reward_every = 0;
  LearnerConfig c;
  c.init_shape = "tiny";
  c.seed = 2;
  c.groups_per_step = 2;
  c.micro_batch_tokens = 4096;
  c.optim.lr = 1e-3;
  c.schedule.warmup_steps = 0;
  c.snapshot_every = c.checkpoint_every = 0;
  c.deterministic = true;
  tweak(c);
  auto comm = make_local_comm();
  SyntheticSource src(sc);
  src.groups_per_step_total = 2;
  LearnerDeps d;
  d.comm = comm.get();
  d.source = &src;
  Learner l(c, d);
  EXPECT_EQ(l.model()->recompute_layers(), c.recompute_layers);
  *peak = CountingCpuAllocator::get().peak_during([&] { EXPECT_TRUE(l.step().updated); });
  EXPECT_TRUE(l.step().updated);
  return l.weights_checksum();
}
}  // namespace

TEST(LearnerMemoryTest, ModelsAboveTheSizeThresholdRecomputeLayersWithTheSameUpdateAndLessMemory) {
  // The tiny model has ~110 k parameters.
  auto threshold = [](int64_t n) { return [n](LearnerConfig& c) { c.recompute_min_params = n; }; };
  int64_t peak_keep = 0, peak_recompute = 0;
  const auto keep = memory_run(threshold(0), &peak_keep);
  const auto recompute = memory_run(threshold(1), &peak_recompute);
  std::printf("step peak bytes: activations kept %lld, layers recomputed %lld\n", static_cast<long long>(peak_keep),
              static_cast<long long>(peak_recompute));
  EXPECT_EQ(recompute, keep) << "recomputation changed the update";
  EXPECT_LT(peak_recompute, peak_keep) << "a model above learner.recompute_min_params kept its activations";
}

// learner.recompute_layers: recomputing only the first layer gives the update of every
// layer recomputed and of none, bitwise, below the peak of none. Here a kept last layer
// even peaks lower than a recomputed one, which keeps its input besides the activations
// backward rebuilds (measured: every layer 13.03 MB, the first only 12.50 MB, none
// 18.84 MB); so only the order against none is asserted.
TEST(LearnerMemoryTest, SelectiveRecomputationGivesTheSameUpdateBelowThePeakOfNone) {
  auto layers = [](int64_t n) {
    return [n](LearnerConfig& c) {
      c.gradient_checkpointing = true;
      c.recompute_layers = n;
    };
  };
  int64_t peak_all = 0, peak_first = 0, peak_none = 0;
  const auto all = memory_run(layers(-1), &peak_all);
  const auto first = memory_run(layers(1), &peak_first);
  const auto none = memory_run(layers(0), &peak_none);
  std::printf("step peak bytes: every layer recomputed %lld, the first only %lld, none %lld\n",
              static_cast<long long>(peak_all), static_cast<long long>(peak_first), static_cast<long long>(peak_none));
  EXPECT_EQ(first, all);
  EXPECT_EQ(none, all);
  EXPECT_LT(peak_first, peak_none);
  EXPECT_LT(peak_all, peak_none);
}

TEST(LearnerChunkedHeadTest, CudaBf16AutocastMatchesTheFullSoftmax) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device: the bf16 chunked head runs only on a GPU";
  torch::manual_seed(12);
  const auto cuda = torch::TensorOptions().device(torch::kCUDA);
  const int64_t N = 1000, H = 128, V = 5000;
  const auto h0 = torch::randn({N, H}, cuda), w0 = torch::randn({V, H}, cuda) * 0.1;
  const auto tgt = torch::randint(0, V, {N}, cuda.dtype(torch::kInt64));
  struct CudaAutocast {
    CudaAutocast() {
      at::autocast::set_autocast_enabled(at::kCUDA, true);
      at::autocast::set_autocast_dtype(at::kCUDA, at::kBFloat16);
      at::autocast::increment_nesting();
    }
    ~CudaAutocast() {
      if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
      at::autocast::set_autocast_enabled(at::kCUDA, false);
    }
  };
  auto hr = h0.clone().requires_grad_(true), wr = w0.clone().requires_grad_(true);
  torch::Tensor lp_ref;
  {
    CudaAutocast on;
    lp_ref =
        torch::log_softmax(torch::matmul(hr, wr.t()).to(torch::kFloat32), -1).gather(1, tgt.unsqueeze(1)).squeeze(1);
  }
  lp_ref.sum().backward();
  auto h = h0.clone().requires_grad_(true), w = w0.clone().requires_grad_(true);
  kf::policy::TokenLogprobs r;
  {
    CudaAutocast on;
    r = kf::policy::chunked_logprobs(h, w, tgt, 1.0, 96);
  }
  r.logp.sum().backward();
  const double d_lp = (r.logp - lp_ref).abs().max().item<double>();
  const double d_h = ((h.grad() - hr.grad()).abs().max() / hr.grad().abs().max()).item<double>();
  const double d_w = ((w.grad() - wr.grad()).abs().max() / wr.grad().abs().max()).item<double>();
  std::printf("CUDA bf16 chunked head vs full: |dlogp| %.3g, rel |dh| %.3g, rel |dW| %.3g\n", d_lp, d_h, d_w);
  EXPECT_LT(d_lp, 1e-2);
  EXPECT_LT(d_h, 2e-2);
  EXPECT_LT(d_w, 2e-2);
}
