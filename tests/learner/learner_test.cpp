// The Learner end to end on a tiny model (2 layers, hidden 64, vocab 256): pulling from
// the replay with staleness, snapshots, skipping groups without signal, learning on a
// fixed batch (GRPO and pairwise), exact resume, checkpoint fallback, and data
// parallelism over 2 and 4 processes against 1 rank on the concatenated batch.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>

#include "checkpoint.h"
#include "kf/common/error.h"
#include "kf/learner/learner.h"
#include "kf/policy/policy.h"
#include "loss.h"
#include "snapshot_publisher.h"
#include "test_util.h"

using namespace kf::learner;
namespace lt = kf::learner::test;

namespace {

const auto* const kOneThread = ::testing::AddGlobalTestEnvironment(new lt::OneThreadEnvironment);

LearnerConfig tiny_config() {
  LearnerConfig c;
  c.init_shape = "tiny";
  c.seed = 11;
  c.groups_per_step = 4;
  c.micro_batch_tokens = 64;  // several micro-batches per step
  c.optim.lr = 1e-3;
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

struct Fixture {
  std::unique_ptr<Communicator> comm = make_local_comm();
  SyntheticSource source{synth()};
  std::unique_ptr<Learner> learner;
  Fixture(const LearnerConfig& cfg, const std::string& ckpt_dir = "") {
    source.groups_per_step_total = cfg.groups_per_step;
    LearnerDeps d;
    d.comm = comm.get();
    d.source = &source;
    d.checkpoint_dir = ckpt_dir;
    learner = std::make_unique<Learner>(cfg, d);
  }
};

// One group whose completions the current model scored itself (behaviour = policy).
class FixedSource : public kf::replay::ReadyGroups {
 public:
  kf::replay::ScoredGroup g;
  std::vector<kf::replay::ScoredGroup> take(const kf::replay::TakeRequest& r) override {
    auto copy = g;
    copy.policy_version = r.version;
    return {copy};
  }
};

torch::Tensor completion_logprob(kf::policy::CausalLM& m, const kf::replay::ScoredGroup& g, std::size_t i) {
  torch::NoGradGuard ng;
  std::vector<int64_t> ids(g.prompt_tokens.begin(), g.prompt_tokens.end());
  for (auto t : g.candidates[i].completion_tokens) ids.push_back(t);
  const auto lp = m->token_logprobs(torch::tensor(ids).view({1, -1}));
  return lp.narrow(1, g.prompt_tokens.size() - 1, g.candidates[i].completion_tokens.size()).sum();
}

// The fixed two-candidate group of margin_after_training: behaviour log-probs are `m`'s.
void score_with(kf::policy::CausalLM& m, kf::replay::ScoredGroup& g) {
  torch::NoGradGuard ng;
  for (auto& c : g.candidates) {
    std::vector<int64_t> ids(g.prompt_tokens.begin(), g.prompt_tokens.end());
    for (auto t : c.completion_tokens) ids.push_back(t);
    const auto lp = m->token_logprobs(torch::tensor(ids).view({1, -1}))
                        .narrow(1, g.prompt_tokens.size() - 1, c.completion_tokens.size());
    for (std::size_t j = 0; j < c.completion_tokens.size(); ++j) c.behaviour_logprobs[j] = lp[0][j].item<float>();
  }
}

double margin_after_training(Objective obj, LearnerConfig cfg = tiny_config(), int steps = 5) {
  cfg.objective = obj;
  if (cfg.lora_rank == 0) cfg.optim.lr = 3e-3;
  cfg.pairwise.beta = 0.5;
  FixedSource src;
  src.g = SyntheticSource(synth()).make_group(0, 0, 0, 4);
  src.g.results[0].reward = 1.0;
  src.g.results[1].reward = 0.0;
  src.g.candidates.resize(2);
  src.g.results.resize(2);
  src.g.missing.resize(2);
  auto comm = make_local_comm();
  LearnerDeps d;
  d.comm = comm.get();
  d.source = &src;
  Learner l(cfg, d);
  auto m = l.model();
  // Behaviour log-probs = the initial policy's, so the ratios start at exactly 1.
  for (std::size_t i = 0; i < 2; ++i) {
    torch::NoGradGuard ng;
    auto& c = src.g.candidates[i];
    std::vector<int64_t> ids(src.g.prompt_tokens.begin(), src.g.prompt_tokens.end());
    for (auto t : c.completion_tokens) ids.push_back(t);
    const auto lp = m->token_logprobs(torch::tensor(ids).view({1, -1}))
                        .narrow(1, src.g.prompt_tokens.size() - 1, c.completion_tokens.size());
    for (std::size_t j = 0; j < c.completion_tokens.size(); ++j) c.behaviour_logprobs[j] = lp[0][j].item<float>();
  }
  const double before = (completion_logprob(m, src.g, 0) - completion_logprob(m, src.g, 1)).item<double>();
  for (int s = 0; s < steps; ++s) EXPECT_TRUE(l.step().updated);
  const double after = (completion_logprob(m, src.g, 0) - completion_logprob(m, src.g, 1)).item<double>();
  std::printf("objective %d (LoRA rank %lld): log-prob margin (better - worse) %.4f -> %.4f after %d steps\n",
              static_cast<int>(obj), static_cast<long long>(cfg.lora_rank), before, after, steps);
  return after - before;
}

}  // namespace

TEST(LearnerTest, GrpoRaisesTheBetterCompletionsLogprob) { EXPECT_GT(margin_after_training(Objective::grpo), 0.05); }

TEST(LearnerTest, PairwiseObjectiveAloneRaisesTheFasterCompletionsMargin) {
  EXPECT_GT(margin_after_training(Objective::pairwise), 0.05);
}

TEST(LearnerTest, GrpoPlusPairwiseRaisesTheMarginToo) {
  EXPECT_GT(margin_after_training(Objective::grpo_pairwise), 0.05);
}

TEST(LearnerTest, StepsWithoutSignalChangeNothing) {
  auto cfg = tiny_config();
  Fixture f(cfg);
  auto s = synth();
  s.equal_reward_every = 1;  // every group: all rewards equal
  SyntheticSource equal(s);
  equal.groups_per_step_total = 4;
  LearnerDeps d;
  d.comm = f.comm.get();
  d.source = &equal;
  Learner l(cfg, d);
  const auto before = l.weights_checksum();
  const auto st = l.step();
  EXPECT_FALSE(st.updated);
  EXPECT_EQ(l.steps_done(), 0);
  EXPECT_EQ(l.weights_checksum(), before);
  EXPECT_EQ(l.counters().at("skipped_equal"), 4);
  EXPECT_EQ(l.counters().at("empty_steps"), 1);
}

// A source whose groups arrive one per take (a slow evaluator).
class OneAtATime : public kf::replay::ReadyGroups {
 public:
  SyntheticSource gen{[] {
    auto c = synth();
    c.equal_reward_every = 0;  // every group carries signal
    return c;
  }()};
  int64_t takes = 0;
  std::vector<kf::replay::ScoredGroup> take(const kf::replay::TakeRequest& r) override {
    EXPECT_GE(r.groups, 1);
    ++takes;
    return {gen.make_group(takes, 0, r.version, r.max_lag)};
  }
};

TEST(LearnerTest, AStepWaitsForMinGroupsPerStepAndUsesAllOfThem) {
  auto cfg = tiny_config();
  cfg.groups_per_step = 3;
  cfg.min_groups_per_step = 3;
  auto comm = make_local_comm();
  OneAtATime src;
  LearnerDeps d;
  d.comm = comm.get();
  d.source = &src;
  Learner l(cfg, d);
  const auto before = l.weights_checksum();
  EXPECT_FALSE(l.step().updated);
  EXPECT_FALSE(l.step().updated);
  EXPECT_EQ(l.weights_checksum(), before) << "stepped before 3 groups were in hand";
  EXPECT_EQ(l.counters().at("waiting_steps"), 2);
  const auto st = l.step();
  EXPECT_TRUE(st.updated);
  EXPECT_EQ(st.groups, 3) << "the held groups were not all used";
  EXPECT_EQ(src.takes, 3);
  // Without the minimum, every take is a step of its own.
  cfg.min_groups_per_step = 1;
  Learner eager(cfg, d);
  EXPECT_TRUE(eager.step().updated);
  const auto bad = kf::Config::parse("learner:\n  groups_per_step: 2\n  min_groups_per_step: 3\n", "run.yaml");
  try {
    (void)learner_config_from(bad);
    FAIL() << "min_groups_per_step above groups_per_step was accepted";
  } catch (const kf::Error& e) {
    EXPECT_NE(std::string(e.what()).find("learner.min_groups_per_step"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("run.yaml"), std::string::npos) << e.what();
  }
}

TEST(LearnerTest, PullsFromTheReplayDropsStaleGroupsAndPublishesSnapshots) {
  const std::string run = "kflt" + std::to_string(::getpid());
  kf::replay::RunShmConfig rc;
  rc.replay.capacity = 16;
  rc.replay.group_bytes = 64 * 1024;
  rc.snapshot.max_bytes = 4u << 20;
  rc.kernels.capacity = 16;
  auto shm = kf::replay::RunShm::create(run, rc);
  SyntheticSource gen(synth());
  gen.groups_per_step_total = 4;
  auto open = [&](int64_t k, int64_t version) {
    auto g = gen.make_group(0, k, version, 4);
    for (auto& c : g.candidates) c.prompt_tokens = g.prompt_tokens;
    ASSERT_TRUE(shm->replay().open_group(g.candidates, std::chrono::seconds(60)));
    for (const auto& r : g.results) ASSERT_TRUE(shm->replay().add_result(r));
  };
  open(0, 0);
  open(1, 0);
  auto cfg = tiny_config();
  cfg.max_staleness = 2;
  cfg.snapshot_every = 1;
  cfg.take_timeout_ms = 200;
  auto comm = make_local_comm();
  auto src = kf::replay::shm_ready_groups(shm->replay(), std::chrono::milliseconds(cfg.take_timeout_ms));
  LearnerDeps d;
  d.comm = comm.get();
  d.source = src.get();
  d.snapshots = &shm->snapshots();
  d.shm = shm.get();
  lt::TempDir tmp;
  d.checkpoint_dir = tmp.path + "/checkpoints";
  Learner l(cfg, d);
  const auto st = l.step();
  ASSERT_TRUE(st.updated);
  EXPECT_EQ(st.groups, 2);
  EXPECT_EQ(l.version(), 1);
  // Groups sampled by version 1 - 3 = -2 are older than the bound (2): dropped, counted.
  open(2, -2);
  open(3, 1);
  const auto st2 = l.step();
  EXPECT_EQ(st2.groups, 1);
  EXPECT_GE(l.counters().at("dropped_stale"), 1);
  // Checkpoints carry the replay's open groups and the kernel database.
  open(4, 2);
  kf::replay::KernelEntry k;
  k.task = "synthetic_0";
  k.speedup = 1.7;
  k.source = "extern \"C\" int kf_forward() { return 0; }";
  shm->kernels().insert(k);
  const std::string ckpt = l.checkpoint();
  EXPECT_NO_THROW(verify_checkpoint(ckpt));
  EXPECT_TRUE(std::ifstream(ckpt + "/replay.bin").good());
  EXPECT_NE(lt::read_text(ckpt + "/kernel_db.json").find("synthetic_0"), std::string::npos);
  EXPECT_NE(lt::read_text(ckpt + "/state.json").find("dropped_stale"), std::string::npos);
  l.publish_snapshot();
  // Wait for the background publish, then read it back like an actor would.
  std::vector<unsigned char> blob;
  kf::replay::SnapshotInfo info;
  for (int i = 0; i < 200; ++i) {
    info = shm->snapshots().read(blob);
    if (info.version == 2) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_EQ(info.version, 2);
  auto fresh = kf::policy::CausalLM(model_shape("tiny"), torch::TensorOptions().dtype(torch::kFloat32));
  EXPECT_EQ(load_weights_blob(fresh, blob.data(), blob.size(), "snapshot"), 2);
  auto a = fresh->named_parameters(), b = l.model()->named_parameters();
  for (const auto& p : b) {
    const auto want = p.value().detach().to(torch::kBFloat16).to(torch::kFloat32);
    EXPECT_TRUE(torch::equal(a[p.key()], want)) << p.key();
  }
  shm->shutdown();
}

TEST(LearnerTest, ExactResumeIsBitwiseEqualToTheStraightRun) {
  lt::TempDir tmp;
  auto cfg = tiny_config();
  cfg.objective = Objective::grpo_pairwise;  // reference model and pairs go through the checkpoint too
  cfg.grpo.kl_coef = 0.05;
  cfg.grpo.std_normalize = true;
  cfg.schedule.kind = ScheduleKind::cosine;
  cfg.schedule.warmup_steps = 2;
  cfg.schedule.total_steps = 6;
  cfg.optim.weight_decay = 0.01;
  uint64_t straight;
  {
    Fixture f(cfg);
    for (int i = 0; i < 6; ++i) f.learner->step();
    EXPECT_EQ(f.learner->steps_done(), 6);
    straight = f.learner->weights_checksum();
  }
  {
    Fixture f(cfg, tmp.path + "/checkpoints");
    for (int i = 0; i < 3; ++i) f.learner->step();
    f.learner->checkpoint();
  }
  Fixture f(cfg, tmp.path + "/checkpoints");
  ASSERT_EQ(f.learner->resume().value_or(-1), 3);
  for (int i = 0; i < 3; ++i) f.learner->step();
  EXPECT_EQ(f.learner->steps_done(), 6);
  EXPECT_EQ(f.learner->weights_checksum(), straight) << "resumed run differs from the straight run";
}

TEST(LearnerTest, ResumeSkipsACorruptLatestCheckpoint) {
  lt::TempDir tmp;
  auto cfg = tiny_config();
  cfg.checkpoint_every = 1;
  cfg.checkpoint_keep = 3;
  uint64_t after_one;
  {
    Fixture f(cfg, tmp.path + "/checkpoints");
    f.learner->step();
    after_one = f.learner->weights_checksum();
    f.learner->step();
  }
  const std::string latest = tmp.path + "/checkpoints/" + checkpoint_name(2) + "/optimizer.safetensors";
  ::truncate(latest.c_str(), 100);
  Fixture f(cfg, tmp.path + "/checkpoints");
  EXPECT_EQ(f.learner->resume().value_or(-1), 1);
  EXPECT_EQ(f.learner->weights_checksum(), after_one);
}

namespace {

struct RankRun {
  std::vector<std::string> checksums;
  std::vector<nlohmann::json> steps;  // rank 0's STEP lines
  std::map<std::string, torch::Tensor> weights;
};

// min_groups > 1 adds the ranks' "is any rank short" all-reduce to every step.
// extra: more `learner:` keys (two-space indented YAML lines), tagged by extra_tag.
RankRun run_ranks(const std::string& dir, int ranks, int steps = 3, int min_groups = 1, const std::string& extra = "",
                  const std::string& extra_tag = "") {
  const std::string tag =
      std::to_string(ranks) + "r" + std::to_string(steps) + "s" + std::to_string(min_groups) + "m" + extra_tag;
  const std::string cfg = dir + "/dp" + tag + ".yaml";
  lt::write_text(cfg, "run:\n  name: dp" + tag + "\n  root: " + dir +
                          "\n  seed: 5\nlearner:\n  groups_per_step: 8\n  micro_batch_tokens: 96\n"
                          "  min_groups_per_step: " +
                          std::to_string(min_groups) + "\n" + extra +
                          "  deterministic: true\n  optim:\n    lr: 1.0e-3\n  schedule:\n    warmup_steps: 0\n"
                          "  snapshot:\n    every: 0\n  checkpoint:\n    every: 0\n  dist:\n    ranks: " +
                          std::to_string(ranks) + "\n");
  const std::string dump = dir + "/weights" + tag + ".safetensors";
  std::vector<pid_t> pids;
  for (int r = 0; r < ranks; ++r) {
    std::vector<std::string> args = {lt::learner_bin(), cfg,
                                     "--synthetic",     "--print-steps",
                                     "--device",        "cpu",
                                     "--steps",         std::to_string(steps),
                                     "--rank",          std::to_string(r),
                                     "--comm-name",     "kf.test.dp" + tag + "." + std::to_string(::getpid())};
    if (r == 0) args.insert(args.end(), {"--dump-weights", dump});
    pids.push_back(lt::spawn(args, dir + "/rank" + tag + "-" + std::to_string(r) + ".log"));
  }
  RankRun out;
  for (int r = 0; r < ranks; ++r) {
    const int code = lt::wait_exit(pids[r]);
    const std::string log = lt::read_text(dir + "/rank" + tag + "-" + std::to_string(r) + ".log");
    EXPECT_EQ(code, 0) << "rank " << r << "/" << ranks << ":\n" << log;
    std::smatch m;
    if (std::regex_search(log, m, std::regex("WEIGHTS_CHECKSUM ([0-9a-f]+)"))) out.checksums.push_back(m[1]);
    if (r == 0) {
      std::istringstream lines(log);
      for (std::string line; std::getline(lines, line);)
        if (line.rfind("STEP ", 0) == 0) out.steps.push_back(nlohmann::json::parse(line.substr(5)));
    }
  }
  if (std::ifstream(dump).good()) out.weights = read_tensors(dump);
  return out;
}

}  // namespace

TEST(LearnerDataParallelTest, TwoAndFourRanksGiveTheOneRankUpdateWithIdenticalWeights) {
  lt::TempDir tmp;
  const auto init = run_ranks(tmp.path, 1, 0);
  const auto one = run_ranks(tmp.path, 1);
  ASSERT_EQ(one.checksums.size(), 1u);
  ASSERT_FALSE(one.weights.empty());
  double moved = 0;
  for (const auto& [name, w] : one.weights)
    moved = std::max(moved, (init.weights.at(name) - w).abs().max().item<double>());
  EXPECT_GT(moved, 1e-3) << "the 1-rank run must actually train";
  for (int ranks : {2, 4}) {
    const auto many = run_ranks(tmp.path, ranks, 3, ranks == 4 ? 8 : 1);  // 4 ranks: with the wait
    ASSERT_EQ(many.checksums.size(), static_cast<std::size_t>(ranks));
    for (int r = 1; r < ranks; ++r) EXPECT_EQ(many.checksums[r], many.checksums[0]) << "rank " << r << " of " << ranks;
    ASSERT_EQ(many.weights.size(), one.weights.size());
    double worst = 0, worst_kbias = 0;
    std::string worst_name;
    for (const auto& [name, w] : one.weights) {
      const double d = (many.weights.at(name) - w).abs().max().item<double>();
      // k_proj.bias has a mathematically zero gradient (softmax ignores a per-row shift), so
      // Adam amplifies its rounding noise: it is compared loosely.
      if (name.find("k_proj.bias") != std::string::npos) {
        worst_kbias = std::max(worst_kbias, d);
      } else if (d > worst) {
        worst = d;
        worst_name = name;
      }
    }
    EXPECT_LT(worst_kbias, 1e-3) << ranks << " ranks";
    // Adam is blind to a gradient scale, so the loss and the gradient norm (before the
    // clip) are compared too: they catch a wrong normalisation over ranks.
    ASSERT_EQ(many.steps.size(), one.steps.size());
    for (std::size_t s = 0; s < one.steps.size(); ++s) {
      const double g1 = one.steps[s]["grad_norm"].get<double>(), gr = many.steps[s]["grad_norm"].get<double>();
      EXPECT_NEAR(g1, gr, 1e-5 * g1) << "grad_norm at step " << s << " with " << ranks << " ranks";
      // The loss is a sum of terms of both signs (mean advantage 0): absolute tolerance.
      EXPECT_NEAR(one.steps[s]["loss"].get<double>(), many.steps[s]["loss"].get<double>(), 1e-6)
          << "loss at step " << s << " with " << ranks << " ranks";
      EXPECT_EQ(one.steps[s]["tokens"], many.steps[s]["tokens"]);
    }
    // The same update up to float summation order (3 AdamW steps of lr 1e-3 move weights ~3e-3).
    // Float summation order differs; Adam turns that into up to a tenth of one step for a
    // near-zero gradient element (o_proj here). Measured 7.8e-5 (2 ranks) and 8.2e-5 (4
    // ranks); the rounding of RMSNorm's backward alone moved them from 1.8e-5 and 4.2e-5.
    // A rank's missing or doubled contribution moves whole steps, and the gradient norm
    // above catches a wrong scale.
    EXPECT_LT(worst, 0.05 * moved) << ranks << " ranks";
    std::printf("%d ranks: max |w - w_1rank| = %.3g in %s (k_proj.bias %.3g; update size %.3g)\n", ranks, worst,
                worst_name.c_str(), worst_kbias, moved);
  }
}

TEST(LearnerToolTest, KfLearnerAttachedToARunTrainsPublishesAndCounts) {
  lt::TempDir tmp;
  const std::string run = "kflt" + std::to_string(::getpid()) + "tool";
  kf::replay::RunShmConfig rc;
  rc.replay.capacity = 8;
  rc.replay.group_bytes = 64 * 1024;
  rc.snapshot.max_bytes = 4u << 20;
  rc.kernels.capacity = 8;
  auto shm = kf::replay::RunShm::create(run, rc);
  shm->control().set_state(kf::replay::RunState::running);
  SyntheticSource gen(synth());
  for (int64_t k : {0, 1}) {
    auto g = gen.make_group(0, k, 0, 4);
    for (auto& c : g.candidates) c.prompt_tokens = g.prompt_tokens;
    ASSERT_TRUE(shm->replay().open_group(g.candidates, std::chrono::seconds(60)));
    for (const auto& r : g.results) ASSERT_TRUE(shm->replay().add_result(r));
  }
  const std::string cfg = tmp.path + "/run.yaml";
  lt::write_text(cfg, "run:\n  name: " + run + "\n  root: " + tmp.path +
                          "\nlearner:\n  groups_per_step: 2\n  take_timeout_ms: 200\n  schedule:\n    warmup_steps: 0\n"
                          "  checkpoint:\n    every: 1\n");
  const std::string log = tmp.path + "/learner.log";
  ASSERT_EQ(lt::run({lt::learner_bin(), cfg, "--run", run, "--device", "cpu", "--steps", "1"}, log), 0)
      << lt::read_text(log);
  EXPECT_EQ(shm->snapshots().latest().version, 1);
  bool found = false;
  for (const auto& p : shm->control().peers(std::chrono::seconds(60)))
    if (p.role == "learner") {
      found = true;
      EXPECT_EQ(p.counters[0], 1u);  // steps
      EXPECT_EQ(p.counters[1], 2u);  // groups used
      EXPECT_EQ(p.counters[7], 1u);  // checkpoints
    }
  EXPECT_TRUE(found) << "kf-learner's control-block entry (counters stay readable after it exits)";
  EXPECT_TRUE(find_latest_valid(tmp.path + "/" + run + "/checkpoints").has_value());
  // The step's line in metrics/learner.jsonl carries the per-step metrics.
  std::istringstream lines(lt::read_text(tmp.path + "/" + run + "/metrics/learner.jsonl"));
  nlohmann::json trained;
  for (std::string line; std::getline(lines, line);)
    if (!line.empty() && nlohmann::json::parse(line).value("updated", 0.0) == 1.0)
      trained = nlohmann::json::parse(line);
  ASSERT_TRUE(trained.is_object()) << "no line of a step that trained in metrics/learner.jsonl";
  for (const char* k : {"kl_behaviour", "entropy", "clip_fraction", "grad_norm", "lr", "response_length_mean",
                        "response_length_max", "truncated_fraction"})
    ASSERT_TRUE(trained.contains(k) && trained[k].is_number()) << k << " missing: " << trained.dump();
  EXPECT_GE(trained["kl_behaviour"].get<double>(), 0.0);
  EXPECT_GT(trained["entropy"].get<double>(), 0.0);
  EXPECT_LE(trained["entropy"].get<double>(), std::log(256.0) + 1e-6);
  EXPECT_GT(trained["grad_norm"].get<double>(), 0.0);
  EXPECT_GE(trained["response_length_max"].get<double>(), trained["response_length_mean"].get<double>());
  EXPECT_GE(trained["truncated_fraction"].get<double>(), 0.0);
  EXPECT_LE(trained["truncated_fraction"].get<double>(), 1.0);
  shm->shutdown();
}

// ---- per-step metrics ----

TEST(LearnerMetricsTest, StepReportsBehaviourKlEntropyGradNormLrAndResponseLengths) {
  auto cfg = tiny_config();
  cfg.optim.lr = 3e-3;
  FixedSource src;
  src.g = SyntheticSource(synth()).make_group(0, 0, 0, 4);
  src.g.candidates.resize(3);
  src.g.results.resize(3);
  src.g.missing.resize(3);
  src.g.results[0].reward = 1.0;
  src.g.results[1].reward = 0.0;
  src.g.results[2].reward = 0.5;
  // Candidate 0 ends in the tiny model's eos id (0); the others do not: 2 of 3 truncated.
  src.g.candidates[0].completion_tokens.back() = 0;
  for (std::size_t i = 1; i < 3; ++i)
    if (src.g.candidates[i].completion_tokens.back() == 0) src.g.candidates[i].completion_tokens.back() = 1;
  auto comm = make_local_comm();
  LearnerDeps d;
  d.comm = comm.get();
  d.source = &src;
  Learner l(cfg, d);
  auto m = l.model();
  score_with(m, src.g);  // behaviour = the current policy: KL to it is 0 at the first step
  // Independent references from the full logits of the initial model.
  double ent_sum = 0, n_tok = 0;
  int64_t longest = 0;
  {
    torch::NoGradGuard ng;
    for (const auto& c : src.g.candidates) {
      std::vector<int64_t> ids(src.g.prompt_tokens.begin(), src.g.prompt_tokens.end());
      for (auto t : c.completion_tokens) ids.push_back(t);
      const auto z = m->forward(torch::tensor(ids).view({1, -1}));
      const auto ls = torch::log_softmax(z, -1).narrow(1, src.g.prompt_tokens.size() - 1, c.completion_tokens.size());
      ent_sum += (-(ls.exp() * ls).sum(-1)).sum().item<double>();
      n_tok += static_cast<double>(c.completion_tokens.size());
      longest = std::max<int64_t>(longest, c.completion_tokens.size());
    }
  }
  const auto st = l.step();
  ASSERT_TRUE(st.updated);
  std::map<std::string, double> got;
  for (const auto& [k, v] : step_scalars(st)) got[k] = v;
  for (const char* k : {"kl_behaviour", "entropy", "clip_fraction", "grad_norm", "lr", "response_length_mean",
                        "response_length_max", "truncated_fraction", "kl"})
    EXPECT_TRUE(got.count(k)) << "metric " << k << " missing";
  EXPECT_NEAR(got["kl_behaviour"], 0.0, 1e-5) << "behaviour = policy, yet KL";
  EXPECT_NEAR(got["entropy"], ent_sum / n_tok, 1e-4);
  EXPECT_LE(got["entropy"], std::log(256.0) + 1e-6);
  EXPECT_GT(got["grad_norm"], 0.0);
  EXPECT_DOUBLE_EQ(got["lr"], cfg.optim.lr);
  EXPECT_DOUBLE_EQ(got["response_length_mean"], n_tok / 3);
  EXPECT_DOUBLE_EQ(got["response_length_max"], static_cast<double>(longest));
  EXPECT_NEAR(got["truncated_fraction"], 2.0 / 3.0, 1e-12);
  EXPECT_DOUBLE_EQ(got["clip_fraction"], 0.0) << "ratios are 1 at the first step";
  // The update moved the policy away from the behaviour: KL > 0, some ratios clipped later.
  const auto st2 = l.step();
  ASSERT_TRUE(st2.updated);
  EXPECT_GT(st2.kl_behaviour, 1e-6);
  EXPECT_GE(st2.clip_fraction, 0.0);
  EXPECT_LE(st2.clip_fraction, 1.0);
}

// kl_start, the k3 KL to the start policy (docs/learner.md): 0 at the first step; after an
// update, the mean over the step's completion tokens of exp(d) - 1 - d, d = log p_start -
// log p, computed here from the full logits of the start model and of the updated one. The
// same with LoRA (the start policy is the base, adapters off); absent when
// kl_start_max_params is 0 and nothing else keeps a reference.
TEST(LearnerMetricsTest, KlStartIsTheK3KlToTheStartWeights) {
  for (const bool lora : {false, true}) {
    auto cfg = tiny_config();
    cfg.optim.lr = 3e-3;
    if (lora) {
      cfg.lora_rank = 4;
      cfg.lora_alpha = 8;
      cfg.optim.lr = 2e-2;
    }
    FixedSource src;
    src.g = SyntheticSource(synth()).make_group(0, 0, 0, 4);
    src.g.results[0].reward = 1.0;
    src.g.results[1].reward = -1.0;
    auto comm = make_local_comm();
    LearnerDeps d;
    d.comm = comm.get();
    d.source = &src;
    Learner l(cfg, d);
    auto m = l.model();
    score_with(m, src.g);
    // Per-token log-probs of every completion under a model, in batch order.
    auto token_logprobs = [&](kf::policy::CausalLM& model) {
      torch::NoGradGuard ng;
      std::vector<double> out;
      for (const auto& c : src.g.candidates) {
        std::vector<int64_t> ids(src.g.prompt_tokens.begin(), src.g.prompt_tokens.end());
        for (auto t : c.completion_tokens) ids.push_back(t);
        const auto lp = model->token_logprobs(torch::tensor(ids).view({1, -1}))
                            .narrow(1, src.g.prompt_tokens.size() - 1, c.completion_tokens.size());
        for (int64_t j = 0; j < lp.size(1); ++j) out.push_back(lp[0][j].item<double>());
      }
      return out;
    };
    const auto start = token_logprobs(m);
    const auto st1 = l.step();
    ASSERT_TRUE(st1.updated);
    EXPECT_EQ(st1.kl_start, 0.0) << "lora " << lora;
    const auto now = token_logprobs(m);  // the weights step 2 computes with
    double k3 = 0;
    for (std::size_t t = 0; t < now.size(); ++t) {
      const double dd = start[t] - now[t];
      k3 += std::exp(dd) - 1 - dd;
    }
    k3 /= static_cast<double>(now.size());
    const auto st2 = l.step();
    ASSERT_TRUE(st2.updated);
    EXPECT_GT(k3, 1e-6) << "the update did not move the policy (lora " << lora << ")";
    EXPECT_NEAR(st2.kl_start, k3, 1e-3 * k3 + 1e-9) << "lora " << lora;
    bool logged = false;
    for (const auto& [k, v] : step_scalars(st2)) logged |= k == "kl_start" && v == st2.kl_start;
    EXPECT_TRUE(logged);
  }
  // Off: no reference is kept for it, nothing logged.
  auto cfg = tiny_config();
  cfg.kl_start_max_params = 0;
  SyntheticSource src(synth());
  auto comm = make_local_comm();
  LearnerDeps d;
  d.comm = comm.get();
  d.source = &src;
  Learner l(cfg, d);
  const auto st = l.step();
  ASSERT_TRUE(st.updated);
  EXPECT_LT(st.kl_start, 0.0);
  for (const auto& [k, v] : step_scalars(st)) EXPECT_NE(k, "kl_start");
}

// ---- LoRA ----

namespace {

LearnerConfig lora_config(int64_t rank = 4) {
  auto c = tiny_config();
  c.lora_rank = rank;
  c.lora_alpha = 8;
  c.optim.lr = 2e-2;
  return c;
}

std::map<std::string, torch::Tensor> base_copy(kf::policy::CausalLM& m) {
  std::map<std::string, torch::Tensor> out;
  for (const auto& p : m->named_parameters())
    if (!kf::policy::is_lora_param(p.key())) out[p.key()] = p.value().detach().clone();
  return out;
}

}  // namespace

TEST(LearnerLoraTest, AdaptersTrainTheBaseStaysBitwiseAndTheOptimizerSeesAdaptersOnly) {
  EXPECT_GT(margin_after_training(Objective::grpo, lora_config(), 8), 0.05);
  auto comm = make_local_comm();
  SyntheticSource src(synth());
  src.groups_per_step_total = 4;
  LearnerDeps d;
  d.comm = comm.get();
  d.source = &src;
  Learner l(lora_config(), d);
  auto m = l.model();
  const auto base = base_copy(m);
  // Step 0 equals the base model (B = 0).
  torch::manual_seed(12);
  const auto ids = torch::randint(0, 256, {2, 9}, torch::kInt64);
  {
    torch::NoGradGuard ng;
    const auto with = m->forward(ids);
    m->set_adapters_active(false);
    const auto without = m->forward(ids);
    m->set_adapters_active(true);
    EXPECT_TRUE(torch::equal(with, without)) << "fresh adapters changed the model";
  }
  int64_t adapters = 0;
  for (const auto& p : m->named_parameters()) {
    EXPECT_EQ(p.value().requires_grad(), kf::policy::is_lora_param(p.key())) << p.key();
    if (kf::policy::is_lora_param(p.key())) ++adapters;
  }
  EXPECT_EQ(adapters, 2 * 2 * 7) << "2 layers x 7 projections x (A, B)";
  for (int s = 0; s < 3; ++s) l.step();
  for (const auto& p : m->named_parameters()) {
    if (kf::policy::is_lora_param(p.key())) continue;
    EXPECT_TRUE(torch::equal(p.value(), base.at(p.key()))) << p.key() << " changed under LoRA";
  }
  double moved = 0;
  for (const auto& p : m->named_parameters())
    if (p.key().find("lora_B") != std::string::npos) moved = std::max(moved, p.value().abs().max().item<double>());
  EXPECT_GT(moved, 0.0) << "lora_B did not move";
}

TEST(LearnerLoraTest, UnmergedForwardEqualsTheMergedWeightsForward) {
  auto mc = model_shape("tiny");
  const auto f32 = torch::TensorOptions().dtype(torch::kFloat32);
  auto m = kf::policy::CausalLM(mc, f32);
  m->init_random(3);
  kf::policy::LoraConfig lc;
  lc.rank = 3;
  lc.alpha = 6;
  lc.targets = {"q_proj", "v_proj", "down_proj"};
  m->enable_lora(lc, 1, torch::kFloat32);
  {
    torch::NoGradGuard ng;
    for (auto& p : m->named_parameters())
      if (p.key().find("lora_B") != std::string::npos) p.value().normal_(0, 0.2);
  }
  auto plain = kf::policy::CausalLM(mc, f32);
  {
    torch::NoGradGuard ng;
    const auto merged = m->merged_weights();
    EXPECT_EQ(merged.size(), plain->named_parameters().size());
    for (auto& p : plain->named_parameters()) p.value().copy_(merged.at(p.key()));
  }
  torch::NoGradGuard ng;
  const auto ids = torch::randint(0, mc.vocab_size, {2, 11}, torch::kInt64);
  const auto a = m->forward(ids), b = plain->forward(ids);
  EXPECT_TRUE(torch::allclose(a, b, 1e-4, 1e-5)) << (a - b).abs().max().item<double>();
  m->set_adapters_active(false);
  EXPECT_FALSE(torch::allclose(m->forward(ids), b, 1e-4, 1e-5)) << "the adapters did nothing";
  kf::policy::LoraConfig bad = lc;
  bad.targets = {"qkv_proj"};
  auto other = kf::policy::CausalLM(mc, f32);
  try {
    other->enable_lora(bad, 1, torch::kFloat32);
    FAIL() << "an unknown target was accepted";
  } catch (const kf::Error& e) {
    EXPECT_NE(std::string(e.what()).find("qkv_proj"), std::string::npos) << e.what();
  }
}

TEST(LearnerLoraTest, SnapshotsCarryOnlyTheAdaptersAndLoadIntoAnAdaptedModel) {
  auto comm = make_local_comm();
  SyntheticSource src(synth());
  src.groups_per_step_total = 4;
  LearnerDeps d;
  d.comm = comm.get();
  d.source = &src;
  Learner l(lora_config(), d);
  l.step();
  auto m = l.model();
  int64_t adapter_bytes = 0, all_bytes = 0;
  for (const auto& p : m->named_parameters()) {
    all_bytes += p.value().numel() * 2;
    if (kf::policy::is_lora_param(p.key())) adapter_bytes += p.value().numel() * 2;
  }
  SnapshotPublisher pub(m, nullptr, torch::kBFloat16);
  pub.publish(1);
  pub.wait();
  std::printf("LoRA snapshot: %llu bytes (adapters %lld bf16, whole model %lld)\n",
              static_cast<unsigned long long>(pub.blob_bytes()), static_cast<long long>(adapter_bytes),
              static_cast<long long>(all_bytes));
  EXPECT_GE(pub.blob_bytes(), static_cast<uint64_t>(adapter_bytes));
  EXPECT_LT(pub.blob_bytes(), static_cast<uint64_t>(adapter_bytes) + 16384) << "more than adapters + header";
  const auto h = kf::policy::st_parse(pub.blob(), pub.blob_bytes(), "snapshot");
  for (const auto& t : h.tensors) EXPECT_TRUE(kf::policy::is_lora_param(t.name)) << t.name;
  EXPECT_EQ(h.metadata.at("kf_lora_rank"), "4");
  EXPECT_EQ(h.metadata.at("kf_lora_targets"), "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj");
  // A reader with the same base and adapters takes them; one without adapters refuses.
  auto fresh = kf::policy::CausalLM(model_shape("tiny"), torch::TensorOptions().dtype(torch::kFloat32));
  fresh->init_random(tiny_config().seed);
  EXPECT_THROW(load_weights_blob(fresh, pub.blob(), pub.blob_bytes(), "snapshot"), kf::Error);
  kf::policy::LoraConfig lc;
  lc.rank = 4;
  lc.alpha = 8;
  lc.targets = lora_config().lora_targets;
  fresh->enable_lora(lc, 0, torch::kFloat32);
  EXPECT_EQ(load_weights_blob(fresh, pub.blob(), pub.blob_bytes(), "snapshot"), 1);
  auto fp = fresh->named_parameters();
  torch::NoGradGuard ng;
  for (const auto& p : m->named_parameters()) {
    const auto want =
        kf::policy::is_lora_param(p.key()) ? p.value().to(torch::kBFloat16).to(torch::kFloat32) : p.value();
    EXPECT_TRUE(torch::equal(fp[p.key()], want)) << p.key();
  }
  const auto ids = torch::randint(0, 256, {1, 10}, torch::kInt64);
  EXPECT_TRUE(torch::allclose(fresh->forward(ids), m->forward(ids), 1e-2, 1e-3)) << "bf16 adapters, unmerged";
}

TEST(LearnerLoraTest, ExactResumeOfLoraStateIsBitwise) {
  lt::TempDir tmp;
  auto cfg = lora_config();
  cfg.grpo.kl_coef = 0.05;  // the reference is the base itself: adapters off
  cfg.schedule.kind = ScheduleKind::cosine;
  cfg.schedule.warmup_steps = 1;
  cfg.schedule.total_steps = 6;
  uint64_t straight;
  std::map<std::string, torch::Tensor> base;
  {
    Fixture f(cfg);
    auto m = f.learner->model();
    base = base_copy(m);
    for (int i = 0; i < 6; ++i) EXPECT_TRUE(f.learner->step().updated);
    straight = f.learner->weights_checksum();
  }
  std::string ckpt;
  {
    Fixture f(cfg, tmp.path + "/checkpoints");
    for (int i = 0; i < 3; ++i) f.learner->step();
    ckpt = f.learner->checkpoint();
  }
  const auto state = nlohmann::json::parse(lt::read_text(ckpt + "/state.json"));
  EXPECT_EQ(state.at("lora").at("rank"), 4);
  const auto saved = read_tensors(ckpt + "/optimizer.safetensors");
  for (const auto& [name, t] : saved)
    EXPECT_NE(name.find("lora_"), std::string::npos) << "optimizer state for a frozen tensor: " << name;
  Fixture f(cfg, tmp.path + "/checkpoints");
  ASSERT_EQ(f.learner->resume().value_or(-1), 3);
  for (int i = 0; i < 3; ++i) f.learner->step();
  EXPECT_EQ(f.learner->weights_checksum(), straight) << "resumed LoRA run differs from the straight run";
  auto m = f.learner->model();
  for (const auto& p : m->named_parameters())
    if (!kf::policy::is_lora_param(p.key())) EXPECT_TRUE(torch::equal(p.value(), base.at(p.key()))) << p.key();
}

TEST(LearnerLoraTest, ConfigNamesTheKeyOfABadTargetRankOrAlpha) {
  const std::pair<const char*, const char*> cases[] = {
      {"learner:\n  lora:\n    rank: 4\n    targets: [q_proj, qkv]\n", "'qkv' is not a projection"},
      {"learner:\n  lora:\n    rank: 4\n    targets: [q_proj, q_proj]\n", "listed twice"},
      {"learner:\n  lora:\n    rank: -1\n", "learner.lora.rank"},
      {"learner:\n  lora:\n    rank: 2\n    alpha: 0\n", "learner.lora.alpha"},
      {"learner:\n  logit_chunk_tokens: 0\n", "learner.logit_chunk_tokens"}};
  for (const auto& [yaml, want] : cases) {
    try {
      (void)learner_config_from(kf::Config::parse(yaml, "run.yaml"));
      ADD_FAILURE() << "accepted:\n" << yaml;
    } catch (const kf::Error& e) {
      EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
    }
  }
  const auto ok = learner_config_from(
      kf::Config::parse("learner:\n  lora:\n    rank: 8\n    targets: [q_proj, v_proj]\n", "run.yaml"));
  EXPECT_EQ(ok.lora_rank, 8);
  EXPECT_EQ(ok.lora_targets, (std::vector<std::string>{"q_proj", "v_proj"}));
  EXPECT_EQ(ok.recompute_min_params, 3000000000LL);
}

TEST(LearnerLoraTest, CudaBf16BaseWithFp32AdaptersTrainsAndPublishesAdaptersOnly) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device: the bf16 LoRA base runs only on a GPU";
  auto cfg = lora_config();
  cfg.deterministic = false;
  cfg.grpo.kl_coef = 0.05;  // reference = the bf16 base with adapters off
  cfg.gradient_checkpointing = true;
  auto comm = make_local_comm();
  SyntheticSource src(synth());
  src.groups_per_step_total = 4;
  LearnerDeps d;
  d.comm = comm.get();
  d.source = &src;
  d.device = torch::Device(torch::kCUDA);
  Learner l(cfg, d);
  auto m = l.model();
  const auto base = base_copy(m);
  for (const auto& p : m->named_parameters())
    EXPECT_EQ(p.value().scalar_type(), kf::policy::is_lora_param(p.key()) ? torch::kFloat32 : torch::kBFloat16)
        << p.key();
  for (int s = 0; s < 3; ++s) {
    const auto st = l.step();
    ASSERT_TRUE(st.updated);
    EXPECT_TRUE(std::isfinite(st.loss) && std::isfinite(st.grad_norm) && std::isfinite(st.entropy));
  }
  for (const auto& p : m->named_parameters())
    if (!kf::policy::is_lora_param(p.key())) EXPECT_TRUE(torch::equal(p.value(), base.at(p.key()))) << p.key();
  SnapshotPublisher pub(m, nullptr, torch::kBFloat16);
  pub.publish(3);
  pub.wait();
  const auto h = kf::policy::st_parse(pub.blob(), pub.blob_bytes(), "snapshot");
  EXPECT_EQ(h.tensors.size(), 2u * 2 * 7);
  for (const auto& t : h.tensors) EXPECT_TRUE(kf::policy::is_lora_param(t.name)) << t.name;
}

TEST(LearnerDataParallelTest, LoraSyncsOnlyAdaptersAndTwoRanksMatchOneRank) {
  lt::TempDir tmp;
  const std::string lora = "  lora:\n    rank: 4\n    alpha: 8\n";
  const auto init = run_ranks(tmp.path, 1, 0, 1, lora, "lora");
  const auto one = run_ranks(tmp.path, 1, 3, 1, lora, "lora");
  const auto two = run_ranks(tmp.path, 2, 3, 1, lora, "lora");
  const auto sharded = run_ranks(tmp.path, 2, 3, 1, lora + "  dist:\n    shard: optimizer\n", "lorashard");
  ASSERT_FALSE(one.weights.empty());
  for (const auto* r : {&two, &sharded}) {
    ASSERT_EQ(r->checksums.size(), 2u);
    EXPECT_EQ(r->checksums[0], r->checksums[1]) << "ranks hold different adapters";
    ASSERT_EQ(r->weights.size(), one.weights.size());
  }
  double moved = 0, worst = 0, worst_sharded = 0;
  for (const auto& [name, w] : one.weights) {
    const double step = (w - init.weights.at(name)).abs().max().item<double>();
    if (!kf::policy::is_lora_param(name)) {
      EXPECT_EQ(step, 0.0) << "frozen " << name << " moved";
      EXPECT_TRUE(torch::equal(two.weights.at(name), w)) << name;
      continue;
    }
    moved = std::max(moved, step);
    worst = std::max(worst, (two.weights.at(name) - w).abs().max().item<double>());
    worst_sharded = std::max(worst_sharded, (sharded.weights.at(name) - w).abs().max().item<double>());
  }
  std::printf("LoRA: adapters moved %.3g; 2 ranks differ by %.3g, 2 sharded ranks by %.3g\n", moved, worst,
              worst_sharded);
  EXPECT_GT(moved, 1e-4) << "the adapters did not train";
  EXPECT_LT(worst, 0.02 * moved);
  EXPECT_LT(worst_sharded, 0.02 * moved);
  ASSERT_EQ(two.steps.size(), one.steps.size());
  for (std::size_t s = 0; s < one.steps.size(); ++s)
    EXPECT_NEAR(one.steps[s]["grad_norm"].get<double>(), two.steps[s]["grad_norm"].get<double>(),
                1e-5 * one.steps[s]["grad_norm"].get<double>())
        << "step " << s;
}

TEST(LearnerLoraTest, RecomputedLayersTrainTheAdaptersLikeKeptActivations) {
  // The frozen embedding's output needs no gradient; the checkpointed layers must still
  // reach their adapters (the 7 B LoRA shape recomputes layers by default).
  auto cfg = lora_config();
  uint64_t kept, recomputed;
  {
    Fixture f(cfg);
    for (int i = 0; i < 2; ++i) ASSERT_TRUE(f.learner->step().updated);
    kept = f.learner->weights_checksum();
  }
  cfg.gradient_checkpointing = true;
  {
    Fixture f(cfg);
    const auto before = f.learner->weights_checksum();
    for (int i = 0; i < 2; ++i) ASSERT_TRUE(f.learner->step().updated);
    recomputed = f.learner->weights_checksum();
    EXPECT_NE(recomputed, before) << "no adapter trained with recomputed layers";
  }
  EXPECT_EQ(recomputed, kept);
}
