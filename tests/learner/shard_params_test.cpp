// Sharded parameters (learner.dist.shard: params, ZeRO-3) on CPU ranks: R Learners, one
// thread each, over the real shared-memory communicator, on the synthetic group stream
// (R ranks together see exactly the batch one rank sees). Checked: the weights after N
// steps against one unsharded rank and against ZeRO-2 (`gradients`), the parameter storage
// each rank holds between steps (read from the tensors' storage), snapshots and
// checkpoints of whole weights, exact resume, and the refusal of LoRA.
#include <gtest/gtest.h>

#include <fstream>

#include <atomic>
#include <chrono>
#include <functional>
#include <thread>

#include "checkpoint.h"
#include "comm.h"
#include "kf/common/error.h"
#include "kf/learner/learner.h"
#include "kf/policy/policy.h"
#include "kf/replay/replay.h"
#include "snapshot_publisher.h"
#include "test_util.h"

using namespace kf::learner;
namespace lt = kf::learner::test;

namespace {

const auto* const kOneThread = ::testing::AddGlobalTestEnvironment(new lt::OneThreadEnvironment);

using Named = std::vector<std::pair<std::string, torch::Tensor>>;

LearnerConfig tiny_config() {
  LearnerConfig c;
  c.init_shape = "tiny";
  c.seed = 11;
  c.groups_per_step = 8;
  c.micro_batch_tokens = 64;  // several micro-batches per rank and step
  c.optim.lr = 1e-3;
  c.optim.weight_decay = 0.01;
  c.optim.grad_clip = 0.1;  // binds: the norms are ~0.5
  c.schedule.warmup_steps = 0;
  c.snapshot_every = 0;
  c.checkpoint_every = 0;
  c.deterministic = true;
  return c;
}

SyntheticConfig synth() {
  SyntheticConfig s;
  s.seed = 5;
  s.equal_reward_every = 3;
  return s;
}

struct RankResult {
  std::string error;
  uint64_t checksum = 0;
  Named weights;                           // whole, gathered
  int64_t bytes_between_steps = -1;        // param_storage_bytes() after the last step
  int64_t model_bytes_between_steps = -1;  // of that, the model's own parameter tensors
  std::vector<StepStats> steps;
  std::string checkpoint;  // rank 0: the path checkpoint() returned
};

// What a rank does with its Learner after construction (default: `steps` steps).
using RankBody = std::function<void(Learner&, int rank, RankResult&)>;

// R ranks, one thread each, over a fresh shared-memory communicator.
std::vector<RankResult> run_ranks(const LearnerConfig& cfg, int ranks, int steps, const std::string& tag,
                                  const std::string& ckpt_dir = "", bool resume = false,
                                  kf::replay::SnapshotStore* snapshots = nullptr) {
  static std::atomic<int> serial{0};
  const std::string seg = "kf.test.zero3." + tag + "." + std::to_string(::getpid()) + "." + std::to_string(serial++);
  std::vector<RankResult> out(ranks);
  std::vector<std::thread> threads;
  for (int r = 0; r < ranks; ++r)
    threads.emplace_back([&, r] {
      auto& res = out[r];
      try {
        auto comm = make_shm_comm(seg, r, ranks, std::chrono::seconds(60));
        SyntheticSource src(synth());
        src.groups_per_step_total = cfg.groups_per_step;
        LearnerDeps d;
        d.comm = comm.get();
        d.source = &src;
        d.checkpoint_dir = ckpt_dir;
        if (r == 0) d.snapshots = snapshots;
        Learner l(cfg, d);
        if (resume) l.resume(false);
        for (int s = 0; s < steps; ++s) res.steps.push_back(l.step());
        if (!ckpt_dir.empty() && !resume) res.checkpoint = l.checkpoint();
        res.bytes_between_steps = l.param_storage_bytes();
        {
          std::set<const void*> seen;
          int64_t n = 0;
          for (const auto& p : l.model()->parameters())
            if (seen.insert(p.storage().unsafeGetStorageImpl()).second) n += p.storage().nbytes();
          res.model_bytes_between_steps = n;
        }
        res.checksum = l.weights_checksum();
        res.weights = l.named_weights();
        l.publish_stats();  // waits for a publish in flight
      } catch (const std::exception& e) {
        res.error = e.what();
      }
    });
  for (auto& t : threads) t.join();
  return out;
}

std::map<std::string, torch::Tensor> as_map(const Named& n) { return {n.begin(), n.end()}; }

double max_abs_diff(const Named& a, const Named& b) {
  const auto ma = as_map(a), mb = as_map(b);
  if (ma.size() != mb.size() || ma.empty()) return -1;
  double worst = 0;
  for (const auto& [name, t] : ma) {
    auto it = mb.find(name);
    if (it == mb.end() || it->second.sizes() != t.sizes()) return -1;
    worst = std::max(worst, (t - it->second).abs().max().item<double>());
  }
  return worst;
}

bool bitwise_equal(const Named& a, const Named& b) {
  const auto ma = as_map(a), mb = as_map(b);
  if (ma.size() != mb.size() || ma.empty()) return false;
  for (const auto& [name, t] : ma) {
    auto it = mb.find(name);
    if (it == mb.end() || !torch::equal(t, it->second)) return false;
  }
  return true;
}

void expect_ok(const std::vector<RankResult>& rs) {
  for (std::size_t r = 0; r < rs.size(); ++r) ASSERT_EQ(rs[r].error, "") << "rank " << r;
  for (std::size_t r = 1; r < rs.size(); ++r) EXPECT_EQ(rs[r].checksum, rs[0].checksum) << "rank " << r;
}

int64_t total_param_bytes(const Named& w) {
  int64_t n = 0;
  for (const auto& [name, t] : w) n += t.numel() * t.element_size();
  return n;
}

}  // namespace

// ZeRO-3 at 2 and 4 ranks, with and without recomputation: every rank ends with the same
// bits; the weights equal ZeRO-2 (`gradients`, the same reductions in the same order)
// bitwise and one unsharded rank within float summation order (3 AdamW steps of ~1e-3).
TEST(LearnerShardParamsTest, MatchesUnshardedAndShardedGradientsAtTwoAndFourRanks) {
  const int steps = 3;
  auto base = tiny_config();
  const auto one = run_ranks(base, 1, steps, "one");
  expect_ok(one);
  const auto init = run_ranks(base, 1, 0, "init");
  expect_ok(init);
  ASSERT_EQ(one[0].steps.size(), 3u);
  for (const auto& st : one[0].steps) ASSERT_TRUE(st.updated);
  for (int ranks : {2, 4}) {
    for (bool recompute : {false, true}) {
      SCOPED_TRACE("ranks " + std::to_string(ranks) + (recompute ? ", recomputation" : ", no recomputation"));
      auto cfg = base;
      cfg.gradient_checkpointing = recompute;
      cfg.shard = ShardMode::params;
      const auto z3 = run_ranks(cfg, ranks, steps, "z3");
      expect_ok(z3);
      cfg.shard = ShardMode::gradients;
      const auto z2 = run_ranks(cfg, ranks, steps, "z2");
      expect_ok(z2);
      EXPECT_TRUE(bitwise_equal(z3[0].weights, z2[0].weights))
          << "z3-z2 " << max_abs_diff(z3[0].weights, z2[0].weights) << " z3-one "
          << max_abs_diff(z3[0].weights, one[0].weights) << " z2-one " << max_abs_diff(z2[0].weights, one[0].weights)
          << " one-init " << max_abs_diff(one[0].weights, init[0].weights);
      // Float summation order only: 300x below the 3-step update (~3e-3).
      const double d = max_abs_diff(z3[0].weights, one[0].weights);
      EXPECT_GE(d, 0.0);
      EXPECT_LT(d, 1e-5);
      for (int s = 0; s < steps; ++s) {
        EXPECT_NEAR(z3[0].steps[s].loss, one[0].steps[s].loss, 1e-6);
        EXPECT_NEAR(z3[0].steps[s].grad_norm, one[0].steps[s].grad_norm, 1e-5);
      }
      // Training moved the weights (the comparison is not of two initial states).
      EXPECT_NE(z3[0].checksum, init[0].checksum);
    }
  }
}

// bf16 weights (learner.param_dtype: bf16, what `auto` picks on CUDA): the fp32 master is
// a slice of its own beside the bf16 slice the rank keeps. ZeRO-3 equals ZeRO-2 bitwise,
// and resumes bitwise (the masters go through the checkpoint).
TEST(LearnerShardParamsTest, Bf16WeightsEqualShardedGradientsAndResumeBitwise) {
  lt::TempDir tmp;
  auto cfg = tiny_config();
  cfg.param_dtype = "bf16";
  cfg.shard = ShardMode::params;
  const auto z3 = run_ranks(cfg, 2, 4, "bf16-z3");
  expect_ok(z3);
  ASSERT_FALSE(z3[0].weights.empty());
  EXPECT_EQ(z3[0].weights[0].second.scalar_type(), torch::kBFloat16);
  auto z2cfg = cfg;
  z2cfg.shard = ShardMode::gradients;
  const auto z2 = run_ranks(z2cfg, 2, 4, "bf16-z2");
  expect_ok(z2);
  EXPECT_TRUE(bitwise_equal(z3[0].weights, z2[0].weights)) << max_abs_diff(z3[0].weights, z2[0].weights);
  const std::string dir = tmp.path + "/checkpoints";
  expect_ok(run_ranks(cfg, 2, 2, "bf16-first", dir));
  const auto resumed = run_ranks(cfg, 2, 2, "bf16-resumed", dir, /*resume=*/true);
  expect_ok(resumed);
  EXPECT_TRUE(bitwise_equal(resumed[0].weights, z3[0].weights));
}

// Ranks with different numbers of micro-batches (3 groups over 2 ranks; 1 group over 2,
// where rank 1 has no data): the short rank runs empty micro-batches so that every rank
// gathers every layer as often; the weights still match one unsharded rank.
TEST(LearnerShardParamsTest, MatchesUnshardedWithUnevenRanks) {
  for (int groups : {3, 1}) {
    SCOPED_TRACE(std::to_string(groups) + " groups over 2 ranks");
    auto cfg = tiny_config();
    cfg.groups_per_step = groups;
    cfg.micro_batch_tokens = 48;
    cfg.min_groups_per_step = 1;
    const auto one = run_ranks(cfg, 1, 2, "uneven1");
    expect_ok(one);
    cfg.shard = ShardMode::params;
    const auto z3 = run_ranks(cfg, 2, 2, "uneven2");
    expect_ok(z3);
    bool any_update = false;
    for (const auto& st : one[0].steps) any_update = any_update || st.updated;
    ASSERT_TRUE(any_update) << "the synthetic groups gave no step with signal";
    const double d = max_abs_diff(z3[0].weights, one[0].weights);
    EXPECT_GE(d, 0.0);
    EXPECT_LT(d, 1e-5);
  }
}

// Between steps each rank holds 1/R of the parameter bytes (up to bucket padding to
// R x 64 elements), read from the storage of the model's tensors and of the rank's
// slices: the model's own parameter tensors hold no bytes at all then.
TEST(LearnerShardParamsTest, EachRankHoldsOneOverRanksOfTheParameterBytesBetweenSteps) {
  auto cfg = tiny_config();
  const auto one = run_ranks(cfg, 1, 1, "bytes1");
  expect_ok(one);
  const int64_t full = total_param_bytes(one[0].weights);
  EXPECT_EQ(one[0].bytes_between_steps, full);
  cfg.shard = ShardMode::params;
  for (int ranks : {2, 4}) {
    SCOPED_TRACE(std::to_string(ranks) + " ranks");
    const auto z3 = run_ranks(cfg, ranks, 1, "bytes");
    expect_ok(z3);
    for (int r = 0; r < ranks; ++r) {
      EXPECT_EQ(z3[r].model_bytes_between_steps, 0) << "rank " << r;
      const double ratio = static_cast<double>(z3[r].bytes_between_steps) / (static_cast<double>(full) / ranks);
      EXPECT_GE(ratio, 1.0) << "rank " << r;
      EXPECT_LT(ratio, 1.05) << "rank " << r << ": " << z3[r].bytes_between_steps << " of " << full << " bytes";
    }
  }
}

// Checkpoints hold whole weights (rank 0 writes them; the format is the unsharded one) and
// resume is exact: 2 ranks checkpoint at step 2 and continue to step 4, bitwise equal to
// the straight 4-step run; the same checkpoint resumed by one unsharded rank equals it too.
TEST(LearnerShardParamsTest, ResumeIsExactAndTheCheckpointHoldsWholeWeights) {
  lt::TempDir tmp;
  auto cfg = tiny_config();
  cfg.shard = ShardMode::params;
  const auto straight = run_ranks(cfg, 2, 4, "straight");
  expect_ok(straight);
  const std::string dir = tmp.path + "/checkpoints";
  const auto first = run_ranks(cfg, 2, 2, "first", dir);
  expect_ok(first);
  ASSERT_NE(first[0].checkpoint, "");
  EXPECT_EQ(first[1].checkpoint, "");
  // The checkpoint's model tensors are rank 0's whole weights at step 2.
  const auto saved = read_tensors(first[0].checkpoint + "/model.safetensors");
  Named saved_named(saved.begin(), saved.end());
  EXPECT_TRUE(bitwise_equal(saved_named, first[0].weights));
  const auto resumed = run_ranks(cfg, 2, 2, "resumed", dir, /*resume=*/true);
  expect_ok(resumed);
  EXPECT_EQ(resumed[0].checksum, straight[0].checksum) << "resumed run differs from the straight run";
  EXPECT_TRUE(bitwise_equal(resumed[0].weights, straight[0].weights));
  auto plain = cfg;
  plain.shard = ShardMode::gradients;
  const auto z2 = run_ranks(plain, 2, 2, "resumed-z2", dir, /*resume=*/true);
  expect_ok(z2);
  EXPECT_TRUE(bitwise_equal(z2[0].weights, straight[0].weights));
  // Re-sharded at another world size: 4 ZeRO-3 ranks resumed from the 2-rank checkpoint
  // equal 4 ZeRO-2 ranks resumed from it.
  const auto z3_4 = run_ranks(cfg, 4, 2, "resumed-4", dir, /*resume=*/true);
  expect_ok(z3_4);
  const auto z2_4 = run_ranks(plain, 4, 2, "resumed-z2-4", dir, /*resume=*/true);
  expect_ok(z2_4);
  EXPECT_TRUE(bitwise_equal(z3_4[0].weights, z2_4[0].weights));
}

// Rank 0 publishes whole weights while every rank takes part in gathering them.
TEST(LearnerShardParamsTest, SnapshotsCarryTheWholeWeights) {
  const std::string run = "kfz3" + std::to_string(::getpid());
  kf::replay::RunShmConfig rc;
  rc.replay.capacity = 4;
  rc.replay.group_bytes = 64 * 1024;
  rc.snapshot.max_bytes = 4u << 20;
  rc.kernels.capacity = 4;
  auto shm = kf::replay::RunShm::create(run, rc);
  auto cfg = tiny_config();
  cfg.shard = ShardMode::params;
  cfg.snapshot_every = 1;
  const auto z3 = run_ranks(cfg, 2, 2, "snap", "", false, &shm->snapshots());
  expect_ok(z3);
  std::vector<unsigned char> blob;
  const auto info = shm->snapshots().read(blob);
  ASSERT_EQ(info.version, 2);
  auto fresh = kf::policy::CausalLM(model_shape("tiny"), torch::TensorOptions().dtype(torch::kFloat32));
  EXPECT_EQ(load_weights_blob(fresh, blob.data(), blob.size(), "snapshot"), 2);
  const auto got = fresh->named_parameters();
  for (const auto& [name, t] : z3[0].weights)
    EXPECT_TRUE(torch::equal(got[name], t.to(torch::kBFloat16).to(torch::kFloat32))) << name;
  shm->shutdown();
}

// On a GPU (one rank, local communicator): the per-layer gathers and frees run through the
// CUDA caching allocator and bf16 autocast, with and without recomputation; the weights
// (bf16, auto) track ZeRO-2's and the model's own tensors hold no bytes between steps.
TEST(LearnerShardParamsTest, CudaOneRankTracksShardedGradients) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  for (bool recompute : {false, true}) {
    SCOPED_TRACE(recompute ? "recomputation" : "no recomputation");
    auto run = [&](ShardMode mode, std::vector<double>* losses, int64_t* model_bytes) {
      auto cfg = tiny_config();
      cfg.shard = mode;
      cfg.gradient_checkpointing = recompute;
      cfg.deterministic = false;
      auto comm = make_local_comm();
      SyntheticSource src(synth());
      src.groups_per_step_total = cfg.groups_per_step;
      LearnerDeps d;
      d.comm = comm.get();
      d.source = &src;
      d.device = torch::Device(torch::kCUDA, 0);
      Learner l(cfg, d);
      for (int s = 0; s < 3; ++s) losses->push_back(l.step().loss);
      int64_t n = 0;
      for (const auto& p : l.model()->parameters()) n += p.storage().nbytes();
      *model_bytes = n;
      return l.named_weights();
    };
    std::vector<double> l2, l3;
    int64_t b2 = 0, b3 = 0;
    const auto w2 = run(ShardMode::gradients, &l2, &b2);
    const auto w3 = run(ShardMode::params, &l3, &b3);
    EXPECT_GT(b2, 0);
    EXPECT_EQ(b3, 0);
    for (int s = 0; s < 3; ++s) EXPECT_NEAR(l3[s], l2[s], 1e-3) << "step " << s;
    const double d = max_abs_diff(w3, w2);
    EXPECT_GE(d, 0.0);
    EXPECT_LT(d, 2e-3);  // bf16 weights; the 3-step update is ~3e-3
  }
}

// LoRA trains adapters on a frozen base: ZeRO-3 is refused, naming both keys.
TEST(LearnerShardParamsTest, LoraWithShardedParametersIsRefusedNamingTheKeys) {
  auto cfg = tiny_config();
  cfg.shard = ShardMode::params;
  cfg.lora_rank = 4;
  auto comm = make_local_comm();
  SyntheticSource src(synth());
  LearnerDeps d;
  d.comm = comm.get();
  d.source = &src;
  try {
    Learner l(cfg, d);
    FAIL() << "LoRA + shard: params was accepted";
  } catch (const kf::Error& e) {
    const std::string w = e.what();
    EXPECT_NE(w.find("learner.dist.shard"), std::string::npos) << w;
    EXPECT_NE(w.find("learner.lora.rank"), std::string::npos) << w;
  }
}

// A Qwen3 shape (per-head q/k norms: small 1-D tensors in every layer, no biases, head_dim
// 24 != 64 / 4) under ZeRO-3 at 2 ranks: ZeRO-2 bitwise, one unsharded rank within float
// summation order.
TEST(LearnerShardParamsTest, Qwen3ShapeMatchesUnshardedAndShardedGradients) {
  lt::TempDir tmp;
  const std::string shape = tmp.path + "/qwen3-tiny.json";
  {
    std::ofstream f(shape);
    f << R"({"model_type": "qwen3", "vocab_size": 256, "hidden_size": 64, "intermediate_size": 128,
      "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 24,
      "attention_bias": false, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "tie_word_embeddings": false,
      "max_position_embeddings": 512, "eos_token_id": 0})";
  }
  auto base = tiny_config();
  base.init_shape = shape;
  const auto one = run_ranks(base, 1, 2, "q3one");
  expect_ok(one);
  EXPECT_TRUE(as_map(one[0].weights).count("model.layers.1.self_attn.k_norm.weight"));
  auto cfg = base;
  cfg.shard = ShardMode::params;
  const auto z3 = run_ranks(cfg, 2, 2, "q3z3");
  expect_ok(z3);
  cfg.shard = ShardMode::gradients;
  const auto z2 = run_ranks(cfg, 2, 2, "q3z2");
  expect_ok(z2);
  EXPECT_TRUE(bitwise_equal(z3[0].weights, z2[0].weights)) << "z3-z2 " << max_abs_diff(z3[0].weights, z2[0].weights);
  const double d = max_abs_diff(z3[0].weights, one[0].weights);
  EXPECT_GE(d, 0.0);
  EXPECT_LT(d, 1e-5);
}
