// AdamW against torch::optim::AdamW, the learning-rate schedule and gradient clipping;
// sharded AdamW against AdamW, alone and in the learner over 2 and 4 CPU ranks.
#include <gtest/gtest.h>

#include <cmath>

#include "grad_buckets.h"
#include "kf/common/config.h"
#include "kf/common/error.h"
#include "kf/learner/learner.h"
#include "kf/policy/policy.h"
#include "optimizer.h"
#include "shard_util.h"

using namespace kf::learner;

TEST(LearnerOptimTest, AdamWMatchesTorchAdamW) {
  torch::manual_seed(3);
  auto a = torch::randn({5, 4}).requires_grad_(true);
  auto b = a.detach().clone().requires_grad_(true);
  OptimConfig oc;
  oc.lr = 1e-2;
  oc.weight_decay = 0.1;
  oc.eps = 1e-8;
  AdamW ours({{"w", a}}, oc);
  torch::optim::AdamW ref({b}, torch::optim::AdamWOptions(1e-2).weight_decay(0.1).eps(1e-8).betas({0.9, 0.999}));
  for (int s = 0; s < 5; ++s) {
    const auto g = torch::randn({5, 4});
    a.mutable_grad() = g.clone();
    b.mutable_grad() = g.clone();
    ours.step(1e-2);
    ref.step();
  }
  EXPECT_LT((a - b).abs().max().item<double>(), 1e-6);
  EXPECT_EQ(ours.steps(), 5);
  EXPECT_EQ(ours.state().size(), 2u);
}

TEST(LearnerOptimTest, ScheduleWarmsUpThenDecays) {
  OptimConfig o;
  o.lr = 1.0;
  ScheduleConfig s;
  s.warmup_steps = 4;
  s.total_steps = 14;
  s.min_lr_ratio = 0.1;
  s.kind = ScheduleKind::constant;
  EXPECT_DOUBLE_EQ(schedule_lr(o, s, 0), 0.25);
  EXPECT_DOUBLE_EQ(schedule_lr(o, s, 3), 1.0);
  EXPECT_DOUBLE_EQ(schedule_lr(o, s, 100), 1.0);
  s.kind = ScheduleKind::linear;
  EXPECT_DOUBLE_EQ(schedule_lr(o, s, 4), 1.0);
  EXPECT_NEAR(schedule_lr(o, s, 9), 0.55, 1e-12);
  EXPECT_NEAR(schedule_lr(o, s, 14), 0.1, 1e-12);
  EXPECT_NEAR(schedule_lr(o, s, 99), 0.1, 1e-12);
  s.kind = ScheduleKind::cosine;
  EXPECT_NEAR(schedule_lr(o, s, 9), 0.55, 1e-12);  // cosine midpoint
  EXPECT_NEAR(schedule_lr(o, s, 14), 0.1, 1e-12);
}

TEST(LearnerOptimTest, ClipScalesToTheMaxNorm) {
  auto p = torch::zeros({2}).requires_grad_(true);
  p.mutable_grad() = torch::tensor({3.0f, 4.0f});
  EXPECT_NEAR(clip_grad_norm({p}, 1.0), 5.0, 1e-9);
  EXPECT_NEAR(p.grad().norm().item<double>(), 1.0, 1e-5);
  p.mutable_grad() = torch::tensor({0.3f, 0.4f});
  clip_grad_norm({p}, 1.0);
  EXPECT_NEAR(p.grad()[0].item<double>(), 0.3, 1e-7);  // under the bound: untouched
}

// ---- Sharded training state (learner.dist.shard: optimizer) ----

namespace {
// Rank 0 of a world of 2 whose collectives do nothing: what one rank computes alone.
class LoneRankComm : public Communicator {
 public:
  int rank() const override { return 0; }
  int world() const override { return 2; }
  std::string name() const override { return "lone rank 0/2"; }
  void all_reduce_sum(torch::Tensor&) override {}
  void reduce_scatter_sum(torch::Tensor&) override {}
  void all_gather(torch::Tensor&) override {}
  void broadcast(torch::Tensor&, int) override {}
  void barrier() override {}
};
}  // namespace

TEST(LearnerOptimTest, ShardedAdamWUpdatesItsSliceBitwiseLikeAdamWAndRoundTripsState) {
  torch::manual_seed(4);
  const std::vector<std::pair<std::string, std::vector<int64_t>>> shapes = {{"a", {30, 7}}, {"b", {5}}, {"c", {64, 3}}};
  std::vector<std::pair<std::string, torch::Tensor>> ps, ref;
  for (const auto& [n, s] : shapes) {
    auto t = torch::randn(s);
    ps.emplace_back(n, t.clone().requires_grad_(true));
    ref.emplace_back(n, t.clone().requires_grad_(true));
  }
  LoneRankComm comm;
  GradBuckets gb(ps, 1 << 20, &comm, /*sharded=*/true);
  ASSERT_EQ(gb.buckets(), 1u);
  const int64_t total = 30 * 7 + 5 + 64 * 3;
  const auto pflat = gb.param_flat(0);
  EXPECT_EQ(pflat.numel() % 128, 0) << "padded to world * 64";
  EXPECT_GE(pflat.numel(), total);
  EXPECT_EQ(gb.shard_numel(0) * 2, pflat.numel());
  // The parameters now live in the flat bucket (filled in reverse order: c, b, a).
  EXPECT_EQ(ps[2].second.data_ptr<float>(), pflat.data_ptr<float>());
  EXPECT_TRUE(torch::equal(ps[0].second, ref[0].second));
  OptimConfig oc;
  oc.lr = 1e-2;
  oc.weight_decay = 0.1;
  AdamW sharded(ps, oc, &gb), plain(ref, oc);
  EXPECT_TRUE(sharded.sharded());
  EXPECT_EQ(sharded.state_bytes(), 2 * 4 * pflat.numel() / 2) << "fp32 parameters: moments only, half the bucket";
  EXPECT_EQ(plain.state_bytes(), 2 * 4 * total);
  for (int s = 0; s < 4; ++s) {
    gb.zero();
    for (std::size_t i = 0; i < ps.size(); ++i) {
      const auto g = torch::randn(ps[i].second.sizes()) * 3;
      ps[i].second.mutable_grad().copy_(g);
      ref[i].second.mutable_grad() = g.clone();
    }
    sharded.step(1e-2);
    plain.step(1e-2);
  }
  // Rank 0 owns elements [0, shard) of the bucket: those moved exactly as plain AdamW's.
  auto ref_flat = torch::cat(
      {ref[2].second.detach().reshape(-1), ref[1].second.detach().reshape(-1), ref[0].second.detach().reshape(-1)});
  const int64_t own = std::min(gb.shard_numel(0), total);
  EXPECT_TRUE(torch::equal(pflat.narrow(0, 0, own), ref_flat.narrow(0, 0, own))) << "owned slice differs from AdamW";
  // State round trip: whole tensors in, this rank's part out (the rest is the other rank's).
  std::vector<torch::Tensor> loaded;
  for (const auto& [n, s] : shapes) {
    loaded.push_back(torch::arange(0, c10::multiply_integers(s), torch::kFloat32).view(s) + 1);
    sharded.load_state_tensor(n + ".exp_avg", loaded.back());
  }
  const auto st = sharded.state();
  ASSERT_EQ(st.size(), 6u);
  EXPECT_EQ(st[4].first, "c.exp_avg");
  // c sits at bucket offset 0: wholly inside rank 0's slice when the slice is big enough.
  if (gb.shard_numel(0) >= 192) EXPECT_TRUE(torch::equal(st[4].second, loaded[2]));
  EXPECT_THROW(sharded.load_state_tensor("a.exp_avg", torch::zeros({7, 30})), kf::Error);
  EXPECT_THROW(sharded.load_state_tensor("zz.exp_avg", torch::zeros({1})), kf::Error);
}

// bf16 parameters: the sharded optimizer keeps an fp32 master for its slice, updates it
// exactly as fp32 AdamW would, writes the rounded value into the bf16 parameter, and
// checkpoints the master ("<name>.master").
TEST(LearnerOptimTest, ShardedAdamWKeepsAnFp32MasterForBf16Parameters) {
  torch::manual_seed(6);
  const auto init = torch::randn({40, 9}).to(torch::kBFloat16);
  std::vector<std::pair<std::string, torch::Tensor>> ps = {{"w", init.clone().requires_grad_(true)}};
  std::vector<std::pair<std::string, torch::Tensor>> ref = {{"w", init.to(torch::kFloat32).requires_grad_(true)}};
  LoneRankComm comm;
  GradBuckets gb(ps, 1 << 20, &comm, /*sharded=*/true);
  EXPECT_EQ(gb.flat()[0].scalar_type(), torch::kBFloat16) << "gradients in the parameters' dtype";
  OptimConfig oc;
  oc.weight_decay = 0.05;
  AdamW sharded(ps, oc, &gb), plain(ref, oc);
  EXPECT_EQ(sharded.state_bytes(), 3 * 4 * gb.shard_numel(0)) << "moments + master for the slice";
  for (int s = 0; s < 3; ++s) {
    gb.zero();
    const auto g = torch::randn({40, 9}).to(torch::kBFloat16);
    ps[0].second.mutable_grad().copy_(g);
    ref[0].second.mutable_grad() = g.to(torch::kFloat32);
    sharded.step(1e-2);
    plain.step(1e-2);
  }
  const int64_t own = gb.shard_numel(0);  // rank 0 owns the first half of the padded bucket
  const auto st = sharded.state();
  ASSERT_EQ(st.size(), 3u);
  EXPECT_EQ(st[2].first, "w.master");
  const auto master = st[2].second.reshape(-1).narrow(0, 0, own);
  const auto want = ref[0].second.detach().reshape(-1).narrow(0, 0, own);
  EXPECT_TRUE(torch::equal(master, want)) << "master differs from fp32 AdamW";
  EXPECT_TRUE(torch::equal(ps[0].second.detach().reshape(-1).narrow(0, 0, own), want.to(torch::kBFloat16)));
  EXPECT_FALSE(torch::equal(master.to(torch::kBFloat16).to(torch::kFloat32), master))
      << "the master must hold more than bf16";
}

// The whole learner, 2 and 4 CPU ranks (processes), same synthetic data: sharded optimizer
// state gives the unsharded run's weights bitwise (the shm reduce-scatter sums each element
// in the rank order the all-reduce uses, the slice update runs AdamW's operations, and the
// fp64 gradient norm rounds to the same fp32 clip scale), every rank holds the same bits
// after the all-gather, and the optimizer state per rank falls as 1/R. Sharded gradients
// (ZeRO-2) are compared up to summation order, with their gradient memory at 1/R.
TEST(LearnerShardTest, ShardedEqualsUnshardedForTwoAndFourRanks) {
  namespace lt = kf::learner::test;
  lt::TempDir tmp;
  for (int ranks : {2, 4}) {
    const std::string r = std::to_string(ranks);
    const auto plain = lt::run_shard_ranks(tmp.path, "plain" + r, ranks, 3, "");
    const auto shard = lt::run_shard_ranks(tmp.path, "shard" + r, ranks, 3, "  dist:\n    shard: optimizer\n");
    const auto grads = lt::run_shard_ranks(tmp.path, "grads" + r, ranks, 3, "  dist:\n    shard: gradients\n");
    for (int k = 0; k < ranks; ++k) {
      ASSERT_EQ(plain.codes[k], 0) << "unsharded rank " << k << "/" << ranks << ":\n" << plain.logs[k];
      ASSERT_EQ(shard.codes[k], 0) << "sharded rank " << k << "/" << ranks << ":\n" << shard.logs[k];
      ASSERT_EQ(grads.codes[k], 0) << "sharded-gradients rank " << k << "/" << ranks << ":\n" << grads.logs[k];
    }
    ASSERT_EQ(shard.checksums.size(), static_cast<std::size_t>(ranks));
    for (int k = 1; k < ranks; ++k)
      EXPECT_EQ(shard.checksums[k], shard.checksums[0]) << "rank " << k << " of " << ranks;
    ASSERT_FALSE(plain.weights.empty());
    ASSERT_FALSE(shard.weights.empty());
    EXPECT_TRUE(lt::bitwise_equal(plain.weights, shard.weights))
        << ranks << " ranks: sharded weights differ from unsharded; max relative difference "
        << lt::max_rel_diff(plain.weights, shard.weights);
    EXPECT_EQ(shard.checksums[0], plain.checksums[0]);
    ASSERT_EQ(shard.steps.size(), 3u);
    for (std::size_t s = 0; s < 3; ++s) {
      EXPECT_GT(plain.steps[s]["grad_norm"].get<double>(), 0.1) << "step " << s << ": the clip (0.1) must bind";
      EXPECT_DOUBLE_EQ(shard.steps[s]["loss"].get<double>(), plain.steps[s]["loss"].get<double>()) << "step " << s;
      EXPECT_NEAR(shard.steps[s]["grad_norm"].get<double>(), plain.steps[s]["grad_norm"].get<double>(),
                  1e-12 * plain.steps[s]["grad_norm"].get<double>())
          << "step " << s;
    }
    // Optimizer state per rank: 1/R of the padded parameters (moments only: fp32 weights
    // are their own master), logged at start.
    const double full = lt::logged_state_bytes(plain.logs[0]);
    ASSERT_GT(full, 0) << plain.logs[0];
    for (int k = 0; k < ranks; ++k) {
      const double mine = lt::logged_state_bytes(shard.logs[k]);
      EXPECT_GE(mine, full / ranks) << "rank " << k;
      EXPECT_LT(mine, full / ranks * 1.1) << "rank " << k << " of " << ranks << " (padding stays small)";
    }
    // Sharded gradients: ranks agree bitwise, weights up to summation order (3 AdamW steps of
    // lr 1e-3 move weights ~3e-3; k_proj.bias has a zero true gradient whose noise Adam
    // enlarges, as in the data-parallel test), and the gradient memory per rank is 1/R of
    // the full buckets that "optimizer" keeps.
    ASSERT_EQ(grads.checksums.size(), static_cast<std::size_t>(ranks));
    for (int k = 1; k < ranks; ++k)
      EXPECT_EQ(grads.checksums[k], grads.checksums[0]) << "rank " << k << " of " << ranks;
    double worst = 0;
    for (const auto& [name, w] : plain.weights)
      if (name.find("k_proj.bias") == std::string::npos)
        worst = std::max(worst, (grads.weights.at(name) - w).abs().max().item<double>());
    EXPECT_LT(worst, 1e-4) << ranks << " ranks, sharded gradients";
    ASSERT_EQ(grads.steps.size(), 3u);
    for (std::size_t s = 0; s < 3; ++s)
      EXPECT_NEAR(grads.steps[s]["grad_norm"].get<double>(), plain.steps[s]["grad_norm"].get<double>(),
                  1e-5 * plain.steps[s]["grad_norm"].get<double>())
          << "step " << s;
    auto grad_bytes = [](const std::string& log) {
      std::smatch m;
      return std::regex_search(log, m, std::regex("gradient memory [0-9.]+ MiB \\(([0-9]+) bytes\\)")) ? std::stod(m[1])
                                                                                                       : -1.0;
    };
    const double full_grads = grad_bytes(shard.logs[0]);
    ASSERT_GT(full_grads, 0) << shard.logs[0];
    for (int k = 0; k < ranks; ++k) EXPECT_DOUBLE_EQ(grad_bytes(grads.logs[k]), full_grads / ranks) << "rank " << k;
    std::printf("%d ranks, sharded gradients: max |w - w_unsharded| = %.3g\n", ranks, worst);
  }
}

// configs/shapes: the Qwen2.5-Coder config.json files parse to the published sizes
// (1.54 B and 7.61 B parameters) that the memory table in docs/learner.md uses.
TEST(LearnerShapeTest, QwenCoderShapeFilesParseToTheirPublishedSizes) {
  const std::string dir = kf::learner::test::source_dir() + "/configs/shapes/";
  auto count = [](const kf::policy::ModelConfig& c) {
    const int64_t h = c.hidden_size, q = c.num_attention_heads * c.head_dim, kv = c.num_key_value_heads * c.head_dim;
    const int64_t layer = (h * q + q) + 2 * (h * kv + kv) + q * h + 3 * h * c.intermediate_size + 2 * h;
    return c.num_hidden_layers * layer + c.vocab_size * h * (c.tie_word_embeddings ? 1 : 2) + h;
  };
  const auto small = kf::policy::load_model_config(dir + "qwen2.5-coder-1.5b.json");
  EXPECT_EQ(small.hidden_size, 1536);
  EXPECT_EQ(small.num_key_value_heads, 2);
  EXPECT_TRUE(small.tie_word_embeddings);
  EXPECT_EQ(small.vocab_size, 151936);
  EXPECT_EQ(count(small), 1543714304);
  const auto big = kf::policy::load_model_config(dir + "qwen2.5-coder-7b.json");
  EXPECT_EQ(big.hidden_size, 3584);
  EXPECT_EQ(big.intermediate_size, 18944);
  EXPECT_EQ(big.num_attention_heads, 28);
  EXPECT_EQ(big.num_key_value_heads, 4);
  EXPECT_FALSE(big.tie_word_embeddings);
  EXPECT_EQ(big.vocab_size, 152064);
  EXPECT_DOUBLE_EQ(big.rope.theta, 1e6);
  EXPECT_EQ(count(big), 7615616512);
}

// configs/shapes/qwen3-8b.json (Qwen3-8B's config.json): per-head q/k norms and no biases,
// 8.19 B parameters (the model card's 8.2 B, 6.95 B without embeddings), counted from the
// model built from it (random init, no weights read).
TEST(LearnerShapeTest, Qwen3ShapeFileBuildsItsPublishedSize) {
  const auto c = kf::policy::load_model_config(kf::learner::test::source_dir() + "/configs/shapes/qwen3-8b.json");
  EXPECT_EQ(c.model_type, "qwen3");
  EXPECT_TRUE(c.qk_norm);
  EXPECT_FALSE(c.qkv_bias);
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_EQ(c.eos_token_ids, (std::vector<int64_t>{151645}));
  // The model built on the meta device (no memory): all its parameters, and per layer what
  // is left without the embeddings (untied) and the final norm.
  kf::policy::CausalLM model(c, torch::TensorOptions().device(torch::kMeta));
  int64_t total = 0;
  for (const auto& p : model->parameters()) total += p.numel();
  EXPECT_EQ(total, 8190735360);
  EXPECT_EQ((total - 2 * c.vocab_size * c.hidden_size - c.hidden_size) / c.num_hidden_layers, 192946432);
}

// learner.dist.shard and learner.init_shape as read from a run config: a shape that is
// neither named nor a readable config.json is refused naming the file and key.
TEST(LearnerShapeTest, ConfigReadsShardAndRefusesAnUnknownShape) {
  using kf::Config;
  EXPECT_EQ(learner_config_from(Config::parse("", "run.yaml")).shard, ShardMode::none);
  EXPECT_EQ(learner_config_from(Config::parse("learner:\n  dist:\n    shard: optimizer\n", "run.yaml")).shard,
            ShardMode::optimizer);
  EXPECT_EQ(learner_config_from(Config::parse("learner:\n  dist:\n    shard: params\n", "run.yaml")).shard,
            ShardMode::params);
  EXPECT_THROW(Config::parse("learner:\n  dist:\n    shard: layers\n", "run.yaml"), kf::Error);  // not a mode
  const std::string shape = kf::learner::test::source_dir() + "/configs/shapes/qwen2.5-coder-7b.json";
  EXPECT_EQ(learner_config_from(Config::parse("learner:\n  init_shape: " + shape + "\n", "run.yaml")).init_shape,
            shape);
  for (const std::string bad : {"qwen9", "/nonexistent/config.json"}) {
    try {
      (void)learner_config_from(Config::parse("learner:\n  init_shape: " + bad + "\n", "run.yaml"));
      ADD_FAILURE() << bad << " was accepted";
    } catch (const kf::Error& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("run.yaml: learner.init_shape"), std::string::npos) << what;
      EXPECT_NE(what.find(bad), std::string::npos) << what;
    }
  }
}

// Sharded gradients (ZeRO-2): every micro-batch is reduce-scattered into per-rank fp32
// accumulators, so the sum over ranks and micro-batches runs in another order than the
// unsharded accumulate-then-all-reduce: the weights agree up to float summation order
// (compared as the data-parallel test does) and every rank holds the same bits. At 2 and 4
// ranks this runs in ShardedEqualsUnshardedForTwoAndFourRanks above; here the ranks are
// uneven on purpose.
TEST(LearnerShardTest, ShardedGradientsMatchUnshardedWithUnevenRanks) {
  namespace lt = kf::learner::test;
  lt::TempDir tmp;
  // Uneven ranks: 3 groups over 2 ranks (one rank has twice the micro-batches), and 1 group
  // over 2 ranks (rank 1 has no data and only joins rank 0's rounds from finish()).
  for (int groups : {3, 1}) {
    const std::string g = std::to_string(groups);
    const auto plain = lt::run_shard_ranks(tmp.path, "uplain" + g, 2, 2, "", {}, "", groups);
    const auto grads =
        lt::run_shard_ranks(tmp.path, "ugrads" + g, 2, 2, "  dist:\n    shard: gradients\n", {}, "", groups);
    for (int k = 0; k < 2; ++k) {
      ASSERT_EQ(plain.codes[k], 0) << plain.logs[k];
      ASSERT_EQ(grads.codes[k], 0) << groups << " groups, rank " << k << ":\n" << grads.logs[k];
    }
    ASSERT_EQ(grads.checksums.size(), 2u);
    EXPECT_EQ(grads.checksums[1], grads.checksums[0]) << groups << " groups";
    double worst = 0;
    for (const auto& [name, w] : plain.weights)
      if (name.find("k_proj.bias") == std::string::npos)
        worst = std::max(worst, (grads.weights.at(name) - w).abs().max().item<double>());
    EXPECT_LT(worst, 1e-4) << groups << " groups over 2 ranks";
    ASSERT_EQ(grads.steps.size(), 2u);
    EXPECT_GE(grads.steps[0]["buckets_in_backward"].get<int64_t>(), 1) << "rank 0's rounds run during backward";
  }
}

// CUDA: the fused update (_fused_adamw_, _foreach_norm) against the per-tensor loop, over
// several tensors, weight decay and a clip that engages; sharded at one rank too.
TEST(LearnerOptimTest, CudaFusedAdamWMatchesTheLoop) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  torch::manual_seed(11);
  const auto dev = torch::Device(torch::kCUDA, 0);
  std::vector<torch::Tensor> init = {torch::randn({64, 33}), torch::randn({7}), torch::randn({3, 5, 9})};
  auto make = [&] {
    std::vector<std::pair<std::string, torch::Tensor>> ps;
    for (std::size_t i = 0; i < init.size(); ++i)
      ps.emplace_back("p" + std::to_string(i), init[i].to(dev).clone().requires_grad_(true));
    return ps;
  };
  auto fused = make(), loop = make();
  OptimConfig fc;
  fc.weight_decay = 0.05;
  OptimConfig lc = fc;
  lc.fused_cuda = false;
  AdamW fo(fused, fc), lo(loop, lc);
  for (int s = 0; s < 4; ++s) {
    for (std::size_t i = 0; i < init.size(); ++i) {
      const auto g = torch::randn(init[i].sizes()).to(dev) * 3.0;
      fused[i].second.mutable_grad() = g.clone();
      loop[i].second.mutable_grad() = g.clone();
    }
    const double nf = fo.clip_grad_norm(1.0), nl = lo.clip_grad_norm(1.0);
    EXPECT_NEAR(nf, nl, 1e-5 * nl);
    EXPECT_GT(nf, 1.0) << "the clip must engage for the test to cover it";
    fo.step(1e-2);
    lo.step(1e-2);
  }
  for (std::size_t i = 0; i < init.size(); ++i) {
    const double moved = (loop[i].second - init[i].to(dev)).abs().max().item<double>();
    EXPECT_GT(moved, 1e-3);
    EXPECT_LT((fused[i].second - loop[i].second).abs().max().item<double>(), 1e-6 + 1e-5 * moved) << "tensor " << i;
  }
}
