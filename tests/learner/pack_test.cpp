// Packed sequences (learner.pack) and bf16 weights with an fp32 master (learner.param_dtype),
// on the tiny model in fp32/bf16 on the CPU:
// - a packed row gives each sequence's own log-probs and gradients (against the sequence
//   alone and against right-padded rows), with recomputed layers too;
// - the packer's rows, and a learner step packed against the same step padded;
// - bf16 weights with an fp32 master track fp32 training, and resume bitwise.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <set>

#include "batch.h"
#include "checkpoint.h"
#include "kf/common/config.h"
#include "kf/common/error.h"
#include "kf/learner/learner.h"
#include "kf/policy/policy.h"
#include "test_util.h"

using namespace kf::learner;
namespace lt = kf::learner::test;

namespace {

kf::policy::CausalLM tiny_model(uint64_t seed, torch::ScalarType dtype = torch::kFloat32) {
  kf::policy::CausalLM m(model_shape("tiny"), torch::TensorOptions().dtype(dtype));
  m->init_random(seed);
  return m;
}

// Sequences of very different lengths; the last is longer than half the 128-token budget.
std::vector<std::vector<int64_t>> test_sequences() {
  std::vector<std::vector<int64_t>> out;
  torch::manual_seed(17);
  for (int64_t n : {5, 37, 2, 81, 12}) {
    const auto t = torch::randint(0, 256, {n}, torch::kInt64);
    out.emplace_back(t.data_ptr<int64_t>(), t.data_ptr<int64_t>() + n);
  }
  return out;
}

// Max |a - b| over max |b|, over every parameter's gradient.
double grad_gap(kf::policy::CausalLM& a, kf::policy::CausalLM& b) {
  double worst = 0;
  auto pb = b->named_parameters();
  for (const auto& p : a->named_parameters()) {
    const auto& ga = p.value().grad();
    const auto& gb = pb[p.key()].grad();
    EXPECT_TRUE(ga.defined() && gb.defined()) << p.key();
    if (!ga.defined() || !gb.defined()) continue;
    const double scale = std::max(gb.abs().max().item<double>(), 1e-12);
    worst = std::max(worst, (ga - gb).abs().max().item<double>() / scale);
  }
  return worst;
}

}  // namespace

// The model: one packed row against each sequence alone and against right-padded rows.
// The loss weights every position (prompt too) by a fixed random weight, so every
// position's log-prob and every gradient path counts.
TEST(LearnerPackTest, PackedRowGivesEachSequencesOwnLogprobsAndGradients) {
  const auto seqs = test_sequences();
  for (bool recompute : {false, true}) {
    SCOPED_TRACE(recompute ? "layers recomputed in backward" : "activations kept");
    auto packed = tiny_model(3), alone = tiny_model(3), padded = tiny_model(3);
    for (auto* m : {&packed, &alone, &padded}) (*m)->set_gradient_checkpointing(recompute);
    std::vector<int64_t> row, lens;
    for (const auto& s : seqs) {
      row.insert(row.end(), s.begin(), s.end());
      lens.push_back(static_cast<int64_t>(s.size()));
    }
    const int64_t T = static_cast<int64_t>(row.size());
    torch::manual_seed(5);
    const auto wts = torch::rand({T - 1});
    // Packed: every position except the last of each sequence (it would predict the next
    // sequence's first token, which no loss may use).
    auto wanted = torch::ones({1, T - 1});
    for (int64_t off = 0, i = 0; i < static_cast<int64_t>(lens.size()); off += lens[i++])
      if (off + lens[i] - 1 < T - 1) wanted[0][off + lens[i] - 1] = 0;
    const auto ids = torch::tensor(row).view({1, T});
    const auto lp = packed->selected_logprobs(ids, {}, wanted, 1.0, 16, lens).logp;
    (lp.view({-1}) * wts).sum().backward();
    // Alone, one forward per sequence, and padded, all sequences in one right-padded batch.
    const int64_t B = static_cast<int64_t>(seqs.size()), L = *std::max_element(lens.begin(), lens.end());
    auto pids = torch::zeros({B, L}, torch::kInt64), pmask = torch::zeros({B, L}, torch::kInt64);
    auto pw = torch::zeros({B, L - 1});
    torch::Tensor alone_loss = torch::zeros({});
    for (int64_t off = 0, i = 0; i < B; off += lens[i++]) {
      const int64_t n = lens[i];
      const auto sid = ids.narrow(1, off, n);
      pids[i].narrow(0, 0, n).copy_(sid[0]);
      pmask[i].narrow(0, 0, n).fill_(1);
      if (n < 2) continue;
      pw[i].narrow(0, 0, n - 1).copy_(wts.narrow(0, off, n - 1));
      const auto a = alone->selected_logprobs(sid, {}, torch::ones({1, n - 1}), 1.0, 16).logp;
      const auto want = lp.narrow(1, off, n - 1).detach();
      EXPECT_LT((a.detach() - want).abs().max().item<double>(), 1e-5) << "sequence " << i << " of length " << n;
      alone_loss = alone_loss + (a.view({-1}) * wts.narrow(0, off, n - 1)).sum();
    }
    alone_loss.backward();
    const auto plp = padded->selected_logprobs(pids, pmask, (pw > 0).to(torch::kFloat32), 1.0, 16).logp;
    (plp * pw).sum().backward();
    EXPECT_LT(grad_gap(packed, alone), 1e-5) << "packed gradients differ from the sequences' own";
    EXPECT_LT(grad_gap(packed, padded), 1e-5) << "packed gradients differ from right-padded rows'";
    std::printf("packed vs alone %.2e, packed vs padded %.2e (max relative gradient gap)\n", grad_gap(packed, alone),
                grad_gap(packed, padded));
  }
  // A row whose lengths do not add up is refused.
  auto m = tiny_model(3);
  EXPECT_THROW(m->selected_logprobs(torch::zeros({1, 10}, torch::kInt64), {}, torch::ones({1, 9}), 1.0, 16, {4, 5}),
               c10::Error);
}

namespace {

kf::replay::ScoredGroup make_group(int64_t prompt, std::vector<int64_t> completions, double r0) {
  kf::replay::ScoredGroup g;
  g.prompt_tokens.assign(prompt, 3);
  for (std::size_t i = 0; i < completions.size(); ++i) {
    kf::replay::Candidate c;
    c.completion_tokens.assign(completions[i], 4);
    c.behaviour_logprobs.assign(completions[i], -1.0f);
    g.candidates.push_back(c);
    kf::replay::Result r;
    r.reward = r0 + static_cast<double>(i);
    g.results.push_back(r);
    g.missing.push_back(0);
  }
  return g;
}

}  // namespace

TEST(LearnerPackTest, PackerFillsRowsWithinTheBudgetAndAlignsEverySequence) {
  LearnerConfig cfg;
  // Sequence lengths: group 0: 10+5, 10+50 (60 > half of 100); group 1: 3+2, 3+30, 3+7.
  const auto b = build_step_batch({make_group(10, {5, 50}, 0), make_group(3, {2, 30, 7}, 0)}, 0, cfg);
  ASSERT_EQ(b.seqs.size(), 5u);
  const auto rows = pack_sequences(b, 64, /*whole_groups=*/false);
  std::multiset<int64_t> seen;
  for (const auto& r : rows) {
    int64_t len = 0;
    for (int64_t i : r) {
      seen.insert(i);
      len += static_cast<int64_t>(b.seqs[i].tokens.size());
    }
    EXPECT_LE(len, 64);
  }
  EXPECT_EQ(seen, (std::multiset<int64_t>{0, 1, 2, 3, 4})) << "every sequence exactly once";
  EXPECT_EQ(rows.size(), 2u) << "60 + 5, then 33 + 15 + 10 + 5 fit in two rows of 64";
  // Whole groups (pairwise): group 0 (75 tokens) is over the budget and gets a row alone.
  const auto grows = pack_sequences(b, 64, /*whole_groups=*/true);
  ASSERT_EQ(grows.size(), 2u);
  EXPECT_EQ(grows[0], (std::vector<int64_t>{0, 1}));
  EXPECT_EQ(grows[1], (std::vector<int64_t>{2, 3, 4}));
  // The packed micro-batch: one row, no padding, each sequence's tensors at its offset.
  const auto mb = make_packed_micro_batch(b, {3, 0});  // 33 tokens, then 15
  ASSERT_EQ(mb.ids.size(0), 1);
  EXPECT_EQ(mb.ids.size(1), 48);
  EXPECT_EQ(mb.segments, (std::vector<int64_t>{33, 15}));
  EXPECT_EQ(mb.real_tokens, mb.padded_tokens());
  EXPECT_EQ(mb.completion.sum().item<float>(), 35.0f);
  // Sequence 0 starts at column 33: prompt 10, so its completion is predicted at 33+9..33+13.
  EXPECT_EQ(mb.completion[0][33 + 8].item<float>(), 0.0f);
  EXPECT_EQ(mb.completion[0][33 + 9].item<float>(), 1.0f);
  EXPECT_EQ(mb.completion[0][33 + 13].item<float>(), 1.0f);
  EXPECT_EQ(mb.seq_slot[0][33 + 9].item<int64_t>(), 1);
  EXPECT_FLOAT_EQ(mb.inv_len[0][33 + 9].item<float>(), 1.0f / 5);
  EXPECT_FLOAT_EQ(mb.inv_len[0][2].item<float>(), 1.0f / 30);
  EXPECT_FLOAT_EQ(mb.advantages[0][33 + 9].item<float>(), static_cast<float>(b.seqs[0].advantage));
  EXPECT_FLOAT_EQ(mb.advantages[0][2].item<float>(), static_cast<float>(b.seqs[3].advantage));
  EXPECT_EQ(mb.completion[0][32].item<float>(), 0.0f) << "the last token of a sequence predicts nothing";
  const auto padded = make_micro_batch(b, {3, 0});
  EXPECT_EQ(padded.padded_tokens(), 66);
  EXPECT_EQ(padded.real_tokens, 48);
}

namespace {

LearnerConfig step_config(bool pack) {
  LearnerConfig c;
  c.init_shape = "tiny";
  c.seed = 11;
  c.groups_per_step = 4;
  c.micro_batch_tokens = 128;
  c.optim.lr = 1e-3;
  c.schedule.warmup_steps = 0;
  c.snapshot_every = c.checkpoint_every = 0;
  c.deterministic = true;
  c.pack = pack;
  return c;
}

SyntheticConfig varied_lengths() {
  SyntheticConfig s;
  s.seed = 9;
  s.prompt_min = 2;
  s.prompt_max = 40;
  s.completion_min = 1;
  s.completion_max = 60;  // up to 100 tokens: over half the 128-token budget
  s.equal_reward_every = 0;
  return s;
}

struct StepRun {
  StepStats st;
  kf::policy::CausalLM model{nullptr};
  std::unique_ptr<Communicator> comm;
  std::unique_ptr<SyntheticSource> src;
  std::unique_ptr<Learner> learner;
};

StepRun one_step(const LearnerConfig& c, torch::Device dev = torch::kCPU) {
  StepRun r;
  r.comm = make_local_comm();
  r.src = std::make_unique<SyntheticSource>(varied_lengths());
  r.src->groups_per_step_total = c.groups_per_step;
  LearnerDeps d;
  d.comm = r.comm.get();
  d.source = r.src.get();
  d.device = dev;
  r.learner = std::make_unique<Learner>(c, d);
  r.st = r.learner->step();
  r.model = r.learner->model();
  return r;
}

}  // namespace

// The learner: one step packed against the same step padded, same data. The losses, the
// gradient norm and every gradient agree to 1e-5 (fp32: only summation order differs).
TEST(LearnerPackTest, PackedStepEqualsPaddedStep) {
  struct Case {
    const char* name;
    Objective obj;
    Aggregation agg;
  };
  for (const auto& k : {Case{"grpo+pairwise, kl, token mean", Objective::grpo_pairwise, Aggregation::token},
                        Case{"grpo, sequence mean", Objective::grpo, Aggregation::sequence}}) {
    SCOPED_TRACE(k.name);
    auto cp = step_config(true), cu = step_config(false);
    for (auto* c : {&cp, &cu}) {
      c->objective = k.obj;
      c->grpo.aggregation = k.agg;
      c->grpo.kl_coef = k.obj == Objective::grpo ? 0.0 : 0.05;
      c->optim.grad_clip = 0;  // compare raw gradients
    }
    {  // the step's data has a sequence longer than half the budget, and very short ones
      SyntheticSource probe(varied_lengths());
      std::size_t longest = 0, shortest = 1 << 20;
      for (int64_t k = 0; k < cp.groups_per_step; ++k) {
        const auto g = probe.make_group(0, k, 0, cp.max_staleness);
        for (const auto& c : g.candidates) {
          longest = std::max(longest, g.prompt_tokens.size() + c.completion_tokens.size());
          shortest = std::min(shortest, g.prompt_tokens.size() + c.completion_tokens.size());
        }
      }
      ASSERT_GT(longest, static_cast<std::size_t>(cp.micro_batch_tokens / 2));
      ASSERT_LT(shortest * 5, longest);
    }
    auto p = one_step(cp), u = one_step(cu);
    ASSERT_TRUE(p.st.updated && u.st.updated);
    EXPECT_EQ(p.st.tokens, u.st.tokens);
    EXPECT_NEAR(p.st.loss, u.st.loss, 1e-5 * std::max(1.0, std::abs(u.st.loss)));
    EXPECT_NEAR(p.st.pairwise_loss, u.st.pairwise_loss, 1e-5 * std::max(1.0, std::abs(u.st.pairwise_loss)));
    EXPECT_NEAR(p.st.grad_norm, u.st.grad_norm, 1e-5 * u.st.grad_norm);
    EXPECT_NEAR(p.st.entropy, u.st.entropy, 1e-5);
    EXPECT_NEAR(p.st.kl_behaviour, u.st.kl_behaviour, 1e-5);
    EXPECT_LT(grad_gap(p.model, u.model), 1e-5);
    EXPECT_EQ(p.st.padding_fraction, 0.0);
    EXPECT_GT(u.st.padding_fraction, 0.1) << "lengths 3..100 padded to each micro-batch's longest";
    bool reported = false;
    for (const auto& [name, v] : step_scalars(u.st))
      if (name == "padding_fraction") reported = v == u.st.padding_fraction;
    EXPECT_TRUE(reported) << "padding_fraction missing from the step metrics";
    std::printf("%s: %lld micro-batches packed, %lld padded (padding %.1f %%); loss %.9g vs %.9g\n", k.name,
                static_cast<long long>(p.st.micro_batches), static_cast<long long>(u.st.micro_batches),
                100 * u.st.padding_fraction, p.st.loss, u.st.loss);
  }
}

// On a GPU under bf16 autocast: the per-sequence causal attention (flash kernels on narrowed
// views) against the padded rows' masked attention. bf16 rounding differs between the two
// layouts, so the bars are bf16's: losses to 1e-2 relative, gradients by cosine > 0.99.
TEST(LearnerPackTest, CudaPackedStepMatchesPaddedUnderBf16Autocast) {
  if (!torch::cuda::is_available())
    GTEST_SKIP() << "no CUDA device: packed attention under autocast runs only on a GPU";
  for (bool recompute : {false, true}) {
    SCOPED_TRACE(recompute ? "layers recomputed" : "activations kept");
    auto cp = step_config(true), cu = step_config(false);
    for (auto* c : {&cp, &cu}) {
      c->deterministic = false;
      c->optim.grad_clip = 0;
      c->gradient_checkpointing = recompute;
      c->grpo.aggregation = Aggregation::sequence;
    }
    auto p = one_step(cp, torch::kCUDA), u = one_step(cu, torch::kCUDA);
    ASSERT_TRUE(p.st.updated && u.st.updated);
    EXPECT_EQ(p.st.padding_fraction, 0.0);
    EXPECT_NEAR(p.st.loss, u.st.loss, 1e-2 * std::max(1e-2, std::abs(u.st.loss)));
    double dot = 0, na = 0, nb = 0;
    auto pu = u.model->named_parameters();
    for (const auto& q : p.model->named_parameters()) {
      const auto a = q.value().grad().to(torch::kFloat64), b = pu[q.key()].grad().to(torch::kFloat64);
      dot += (a * b).sum().item<double>();
      na += a.pow(2).sum().item<double>();
      nb += b.pow(2).sum().item<double>();
    }
    const double cosine = dot / std::sqrt(na * nb);
    std::printf("CUDA bf16 autocast, packed vs padded: loss %.6g vs %.6g, gradient cosine %.5f\n", p.st.loss, u.st.loss,
                cosine);
    EXPECT_GT(cosine, 0.99);
  }
}

// ---- bf16 weights with an fp32 master ----

namespace {

LearnerConfig bf16_config(const std::string& dtype) {
  LearnerConfig c = step_config(true);
  c.param_dtype = dtype;
  c.optim.lr = 2e-5;  // below half a bf16 ulp of most weights (|w| ~ 0.02: ulp 1.2e-4)
  return c;
}

}  // namespace

namespace {

// The same groups every step (step 0's of a SyntheticSource), so training makes steady
// progress on them that both runs can be compared on.
class FixedBatchSource : public kf::replay::ReadyGroups {
 public:
  explicit FixedBatchSource(SyntheticConfig c) : src_(c) {}
  std::vector<kf::replay::ScoredGroup> take(const kf::replay::TakeRequest& r) override {
    std::vector<kf::replay::ScoredGroup> out;
    for (int64_t k = 0; k < r.groups; ++k) out.push_back(src_.make_group(0, k, r.version, r.max_lag));
    return out;
  }

 private:
  SyntheticSource src_;
};

// A tiny model folder whose weights are bf16 values (the seed-11 init rounded), so an fp32
// and a bf16 learner loading it start from the same weights. Returns them, as fp32.
std::map<std::string, torch::Tensor> save_bf16_exact_base(const std::string& dir) {
  kf::policy::Policy p;
  p.config = model_shape("tiny");
  p.model = tiny_model(11);
  torch::NoGradGuard ng;
  std::map<std::string, torch::Tensor> out;
  for (auto& t : p.model->named_parameters()) {
    t.value().copy_(t.value().to(torch::kBFloat16));
    out[t.key()] = t.value().detach().clone();
  }
  kf::policy::save_policy(p, dir);
  return out;
}

}  // namespace

// N = 8 steps of GRPO on one fixed batch, CPU. The bf16 run also computes in bf16 (no
// autocast on the CPU), so its log-probs carry bf16 rounding (|logp| ~ 5.5: an ulp of
// 0.03) on top of the weights' rounding; its updates differ from fp32's by that noise,
// not by lost updates. Both start from the same (bf16-exact) weights. Bars, set from the
// measured values printed below (loss drops 2 % apart, cosine 0.9986) with room for the
// bf16 noise: the loss falls by the same amount to within 10 %, and the masters' total
// update points the way fp32's does (cosine > 0.98). The learning rate keeps most single updates below half a bf16 ulp
// of their weight: without the master, most would round away every step.
TEST(LearnerBf16Test, Bf16WeightsWithAnFp32MasterTrackFp32Training) {
  lt::TempDir tmp;
  const int steps = 8;
  const auto init = save_bf16_exact_base(tmp.path + "/base");
  auto run = [&](const std::string& dtype, std::vector<double>* losses) {
    auto comm = make_local_comm();
    FixedBatchSource src(varied_lengths());
    LearnerDeps d;
    d.comm = comm.get();
    d.source = &src;
    d.checkpoint_dir = tmp.path + "/" + dtype;
    auto c = bf16_config(dtype);
    c.policy = tmp.path + "/base";
    Learner l(c, d);
    for (const auto& p : l.model()->parameters())
      EXPECT_EQ(p.scalar_type(), dtype == "bf16" ? torch::kBFloat16 : torch::kFloat32);
    for (int i = 0; i < steps; ++i) {
      const auto st = l.step();
      EXPECT_TRUE(st.updated);
      losses->push_back(st.loss);
    }
    return l.checkpoint();
  };
  std::vector<double> l32, l16;
  const auto c32 = run("fp32", &l32), c16 = run("bf16", &l16);
  const auto w32 = read_tensors(c32 + "/model.safetensors");
  const auto w16 = read_tensors(c16 + "/model.safetensors");
  const auto opt16 = read_tensors(c16 + "/optimizer.safetensors");
  double dot = 0, n32 = 0, n16 = 0, rounded_away = 0, master_moved = 0;
  for (const auto& [name, want] : w32) {
    const auto it = opt16.find(name + ".master");
    ASSERT_NE(it, opt16.end()) << "no fp32 master for " << name;
    const auto& master = it->second;
    ASSERT_EQ(master.scalar_type(), torch::kFloat32);
    EXPECT_TRUE(torch::equal(master.to(torch::kBFloat16), w16.at(name)))
        << name << ": weights are not the master rounded";
    const auto& i16 = init.at(name);
    const auto u32 = (want - i16).to(torch::kFloat64), u16 = (master - i16).to(torch::kFloat64);
    dot += (u32 * u16).sum().item<double>();
    n32 += u32.pow(2).sum().item<double>();
    n16 += u16.pow(2).sum().item<double>();
    // Plain bf16 weights would apply each step's update to the bf16 value and round: an
    // element whose mean step (u / steps) rounds back to its initial value loses it.
    const auto mv = u16.abs() > 0;
    const auto one_step = (i16 + (u16 / steps).to(torch::kFloat32)).to(torch::kBFloat16).to(torch::kFloat32);
    master_moved += mv.sum().item<double>();
    rounded_away += (mv & (one_step == i16)).sum().item<double>();
  }
  const double cosine = dot / std::sqrt(n32 * n16);
  const double drop32 = l32.front() - l32.back(), drop16 = l16.front() - l16.back();
  std::printf(
      "after %d steps: loss %.5f -> %.5f (fp32), %.5f -> %.5f (bf16 + fp32 master); update cosine %.4f, "
      "norms %.4g vs %.4g; a single step of %.0f %% of the moved elements rounds away in bf16\n",
      steps, l32.front(), l32.back(), l16.front(), l16.back(), cosine, std::sqrt(n32), std::sqrt(n16),
      100 * rounded_away / master_moved);
  EXPECT_GT(drop32, 0) << "fp32 training did not lower the loss: the comparison says nothing";
  EXPECT_NEAR(drop16, drop32, 0.1 * drop32) << "bf16 + fp32 master learned differently from fp32";
  EXPECT_GT(cosine, 0.98) << "bf16 + fp32 master's update points elsewhere than fp32's";
  EXPECT_GT(rounded_away / master_moved, 0.5) << "the updates were not below bf16 resolution: the test proves little";
}

// Exact resume with bf16 weights: the checkpoint carries the fp32 masters, so the resumed
// run is bitwise the straight one (unsharded, and sharded over one rank).
TEST(LearnerBf16Test, ExactResumeWithBf16WeightsIsBitwise) {
  for (ShardMode shard : {ShardMode::none, ShardMode::optimizer}) {
    SCOPED_TRACE(shard == ShardMode::none ? "unsharded" : "sharded optimizer");
    lt::TempDir tmp;
    auto cfg = bf16_config("bf16");
    cfg.shard = shard;
    cfg.optim.weight_decay = 0.01;
    cfg.schedule.kind = ScheduleKind::cosine;
    cfg.schedule.warmup_steps = 1;
    cfg.schedule.total_steps = 6;
    auto make = [&](const std::string& dir, std::unique_ptr<Communicator>& comm, SyntheticSource& src) {
      comm = make_local_comm();
      src.groups_per_step_total = cfg.groups_per_step;
      LearnerDeps d;
      d.comm = comm.get();
      d.source = &src;
      d.checkpoint_dir = dir;
      return std::make_unique<Learner>(cfg, d);
    };
    uint64_t straight;
    {
      std::unique_ptr<Communicator> comm;
      SyntheticSource src(varied_lengths());
      auto l = make("", comm, src);
      for (int i = 0; i < 6; ++i) l->step();
      straight = l->weights_checksum();
    }
    {
      std::unique_ptr<Communicator> comm;
      SyntheticSource src(varied_lengths());
      auto l = make(tmp.path + "/ck", comm, src);
      for (int i = 0; i < 3; ++i) l->step();
      l->checkpoint();
    }
    std::unique_ptr<Communicator> comm;
    SyntheticSource src(varied_lengths());
    auto l = make(tmp.path + "/ck", comm, src);
    ASSERT_EQ(l->resume().value_or(-1), 3);
    for (int i = 0; i < 3; ++i) l->step();
    EXPECT_EQ(l->weights_checksum(), straight) << "resumed bf16 run differs from the straight run";
  }
}

// A checkpoint written with fp32 weights resumes into bf16 weights whose masters are the
// fp32 weights exactly (not their bf16 rounding).
TEST(LearnerBf16Test, Fp32CheckpointResumesIntoBf16WeightsWithExactMasters) {
  lt::TempDir tmp;
  auto make = [&](const std::string& dtype, std::unique_ptr<Communicator>& comm, SyntheticSource& src) {
    comm = make_local_comm();
    LearnerDeps d;
    d.comm = comm.get();
    d.source = &src;
    d.checkpoint_dir = tmp.path + "/" + dtype;
    return std::make_unique<Learner>(bf16_config(dtype), d);
  };
  std::string ck32;
  {
    std::unique_ptr<Communicator> comm;
    SyntheticSource src(varied_lengths());
    auto l = make("fp32", comm, src);
    for (int i = 0; i < 2; ++i) l->step();
    ck32 = l->checkpoint();
  }
  std::unique_ptr<Communicator> comm;
  SyntheticSource src(varied_lengths());
  auto l = make("bf16", comm, src);
  l->load_checkpoint(ck32, false);
  const auto ck16 = l->checkpoint();
  const auto w32 = read_tensors(ck32 + "/model.safetensors");
  const auto opt16 = read_tensors(ck16 + "/optimizer.safetensors");
  for (const auto& [name, w] : w32) {
    ASSERT_EQ(w.scalar_type(), torch::kFloat32);
    ASSERT_TRUE(opt16.count(name + ".master")) << name;
    EXPECT_TRUE(torch::equal(opt16.at(name + ".master"), w)) << name << ": master is not the fp32 weight";
  }
}

TEST(LearnerBf16Test, ParamDtypeIsCheckedAndNamed) {
  try {
    (void)learner_config_from(kf::Config::parse("learner:\n  param_dtype: fp16\n", "run.yaml"));
    ADD_FAILURE() << "param_dtype fp16 accepted";
  } catch (const kf::Error& e) {
    EXPECT_NE(std::string(e.what()).find("learner.param_dtype"), std::string::npos) << e.what();
  }
  const auto c = learner_config_from(kf::Config::parse("learner:\n  param_dtype: bf16\n  pack: false\n", "run.yaml"));
  EXPECT_EQ(c.param_dtype, "bf16");
  EXPECT_FALSE(c.pack);
  auto bad = bf16_config("fp16");
  auto comm = make_local_comm();
  SyntheticSource src(varied_lengths());
  LearnerDeps d;
  d.comm = comm.get();
  d.source = &src;
  try {
    Learner l(bad, d);
    ADD_FAILURE() << "a Learner with param_dtype fp16 was built";
  } catch (const kf::Error& e) {
    EXPECT_NE(std::string(e.what()).find("learner.param_dtype"), std::string::npos) << e.what();
  }
}

// On a GPU: param_dtype auto with a sharded optimizer holds bf16 weights (fp32 masters in
// the optimizer) and trains like fp32 weights under the same bf16 autocast: the forward
// matmuls are bf16 either way, so the losses agree closely.
TEST(LearnerBf16Test, CudaShardedAutoHoldsBf16WeightsAndTracksFp32) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device: bf16 weights under autocast run only on a GPU";
  lt::TempDir tmp;
  save_bf16_exact_base(tmp.path + "/base");
  auto run = [&](const std::string& dtype, ShardMode shard, std::vector<double>* losses) {
    auto comm = make_local_comm();
    FixedBatchSource src(varied_lengths());
    LearnerDeps d;
    d.comm = comm.get();
    d.source = &src;
    d.device = torch::Device(torch::kCUDA);
    auto c = bf16_config(dtype);
    c.policy = tmp.path + "/base";
    c.deterministic = false;
    c.shard = shard;
    Learner l(c, d);
    for (const auto& p : l.model()->parameters())
      EXPECT_EQ(p.scalar_type(), dtype == "fp32" ? torch::kFloat32 : torch::kBFloat16);
    for (int i = 0; i < 8; ++i) {
      const auto st = l.step();
      ASSERT_TRUE(st.updated);
      ASSERT_TRUE(std::isfinite(st.loss) && std::isfinite(st.grad_norm));
      losses->push_back(st.loss);
    }
  };
  std::vector<double> l32, l16;
  run("fp32", ShardMode::none, &l32);
  run("auto", ShardMode::optimizer, &l16);
  const double drop32 = l32.front() - l32.back(), drop16 = l16.front() - l16.back();
  std::printf("CUDA: loss %.5f -> %.5f (fp32 weights), %.5f -> %.5f (bf16 weights, sharded optimizer)\n", l32.front(),
              l32.back(), l16.front(), l16.back());
  EXPECT_GT(drop32, 0);
  EXPECT_NEAR(drop16, drop32, 0.2 * drop32);
}
