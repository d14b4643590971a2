// Sampler: KV-cache generation agrees with full forwards; seeded; stops (EOS, stop strings,
// loops); masks padding.
#include <gtest/gtest.h>

#include <algorithm>

#include "kf/common/error.h"
#include "kf/policy/policy.h"
#include "sampler.h"
#include "torch_util.h"

using namespace kf::policy;
namespace t = kf::policy::test;

namespace {

Policy qwen() { return load_policy(t::refs_dir() + "/qwen2", torch::kCPU); }
const std::vector<std::vector<int32_t>> kPrompts = {{5, 17, 42, 99, 7}, {3, 8}, {250, 1, 2, 3, 4, 5, 6, 7}};

// The log-prob of each completion token under a fresh full forward of prompt + completion.
void expect_logprobs_match_forward(CausalLM& m, const std::vector<int32_t>& prompt, const Completion& c, double temp) {
  std::vector<int64_t> seq(prompt.begin(), prompt.end());
  seq.insert(seq.end(), c.tokens.begin(), c.tokens.end());
  const auto ids = torch::tensor(seq).unsqueeze(0);
  torch::NoGradGuard g;
  const auto lp = m->token_logprobs(ids, {}, temp).squeeze(0);
  const int64_t n = static_cast<int64_t>(c.tokens.size());
  const auto ours = torch::tensor(c.logprobs);
  EXPECT_LT(t::max_abs_diff(lp.narrow(0, lp.size(0) - n, n), ours), 1e-4);
}

SamplingParams loop_params(int64_t repeats, int64_t max_period, int64_t min_span) {
  SamplingParams sp;
  sp.loop_repeats = repeats;
  sp.loop_max_period = max_period;
  sp.loop_min_span = min_span;
  return sp;
}

// `head`, then `block` k times, then `tail`.
std::vector<int32_t> with_repeats(std::vector<int32_t> head, const std::vector<int32_t>& block, int k,
                                  const std::vector<int32_t>& tail = {}) {
  for (int i = 0; i < k; ++i) head.insert(head.end(), block.begin(), block.end());
  head.insert(head.end(), tail.begin(), tail.end());
  return head;
}

// n distinct ids from `from` on (a block with no smaller period).
std::vector<int32_t> distinct(int32_t from, int n) {
  std::vector<int32_t> v(n);
  for (int i = 0; i < n; ++i) v[i] = from + i;
  return v;
}

// Prompts for the greedy loop tests: the three above and eight more.
std::vector<std::vector<int32_t>> loop_prompts() {
  auto prompts = kPrompts;
  for (int32_t i = 0; i < 8; ++i) prompts.push_back({10 + 37 * i, 200 + i, 3 * i + 1});
  return prompts;
}

}  // namespace

TEST(PolicySamplerTest, SeededSamplingIsReproducible) {
  auto p = qwen();
  Sampler s(p.model, nullptr);
  SamplingParams sp;
  sp.max_new_tokens = 12;
  sp.seed = 1234;
  sp.top_p = 0.9;
  sp.top_k = 50;
  const auto a = s.generate(kPrompts, sp), b = s.generate(kPrompts, sp);
  sp.seed = 99;
  const auto c = s.generate(kPrompts, sp);
  bool differs = false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].tokens, b[i].tokens);
    EXPECT_EQ(a[i].logprobs, b[i].logprobs);
    EXPECT_EQ(a[i].tokens.size(), 12u);
    EXPECT_EQ(a[i].finish_reason, "length");
    differs = differs || a[i].tokens != c[i].tokens;
  }
  EXPECT_TRUE(differs);
}

TEST(PolicySamplerTest, LogprobsMatchFullForward) {
  auto p = qwen();
  Sampler s(p.model, nullptr);
  SamplingParams sp;
  sp.max_new_tokens = 10;
  sp.temperature = 0.8;
  sp.seed = 7;
  const auto out = s.generate(kPrompts, sp);
  for (std::size_t i = 0; i < out.size(); ++i) expect_logprobs_match_forward(p.model, kPrompts[i], out[i], 0.8);
}

// The fixed-shape decode (CUDA-graph capturable) and the growing-cache decode agree.
TEST(PolicySamplerTest, StaticAndEagerDecodeAgree) {
  auto p = qwen();
  Sampler s(p.model, nullptr);
  SamplingParams sp;
  sp.max_new_tokens = 10;
  sp.seed = 11;
  sp.static_decode = 1;
  const auto a = s.generate(kPrompts, sp);
  sp.static_decode = 0;
  const auto b = s.generate(kPrompts, sp);
  for (std::size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].tokens, b[i].tokens);
    for (std::size_t j = 0; j < a[i].logprobs.size(); ++j) EXPECT_NEAR(a[i].logprobs[j], b[i].logprobs[j], 1e-4);
  }
}

TEST(PolicySamplerTest, GreedyFollowsFullForwardArgmax) {
  auto p = qwen();
  Sampler s(p.model, nullptr);
  SamplingParams sp;
  sp.max_new_tokens = 8;
  sp.temperature = 0;
  const auto out = s.generate(kPrompts, sp);
  torch::NoGradGuard g;
  for (std::size_t i = 0; i < out.size(); ++i) {
    std::vector<int64_t> seq(kPrompts[i].begin(), kPrompts[i].end());
    for (int32_t tok : out[i].tokens) {
      const auto logits = p.model->forward(torch::tensor(seq).unsqueeze(0));
      EXPECT_EQ(logits[0][-1].argmax().item<int64_t>(), tok);
      seq.push_back(tok);
    }
  }
}

TEST(PolicySamplerTest, TopKOneIsGreedyAndPaddingIdsNeverSampled) {
  auto p = qwen();
  Sampler s(p.model, nullptr);
  SamplingParams sp;
  sp.max_new_tokens = 6;
  sp.temperature = 0;
  const auto greedy = s.generate(kPrompts, sp);
  sp.temperature = 1.5;
  sp.top_k = 1;
  sp.seed = 3;
  const auto k1 = s.generate(kPrompts, sp);
  for (std::size_t i = 0; i < k1.size(); ++i) EXPECT_EQ(k1[i].tokens, greedy[i].tokens);
  // Only ids < 40 are real: sampling at a high temperature must stay inside them.
  sp.top_k = 0;
  sp.temperature = 5.0;
  sp.valid_vocab = 40;
  sp.max_new_tokens = 30;
  for (const auto& c : s.generate(kPrompts, sp))
    for (int32_t tok : c.tokens) EXPECT_LT(tok, 40);
}

TEST(PolicySamplerTest, TopPKeepsOnlyTheNucleus) {
  // Probabilities 0.5, 0.3, 0.15, 0.05: top_p = 0.7 keeps the first two only.
  const auto logits = torch::log(torch::tensor({0.5, 0.3, 0.15, 0.05}, torch::kFloat32)).unsqueeze(0).repeat({4000, 1});
  SamplingParams sp;
  sp.top_p = 0.7;
  auto gen = at::globalContext().defaultGenerator(torch::kCPU).clone();
  gen.set_current_seed(5);
  auto [tok, lp] = sample_tokens(logits, sp, -1, gen);
  EXPECT_LE(tok.max().item<int64_t>(), 1);
  const double frac0 = (tok == 0).to(torch::kFloat64).mean().item<double>();
  EXPECT_NEAR(frac0, 0.5 / 0.8, 0.03);
  // Log-probs are those of the distribution sampled from: the nucleus, renormalised.
  for (int64_t i = 0; i < 8; ++i)
    EXPECT_NEAR(lp[i].item<float>(), std::log(tok[i].item<int64_t>() == 0 ? 0.5 / 0.8 : 0.3 / 0.8), 1e-5);
}

TEST(PolicySamplerTest, BehaviourLogprobsAreThoseOfTheDistributionSampledFrom) {
  // Logits 2, 1, 0, -1 at temperature 0.5: softmax(x / T) is the tempered distribution.
  const auto base = torch::tensor({2.0, 1.0, 0.0, -1.0}, torch::kFloat32);
  const auto logits = base.unsqueeze(0).repeat({6000, 1});
  auto gen = at::globalContext().defaultGenerator(torch::kCPU).clone();
  gen.set_current_seed(11);
  const auto tempered = torch::softmax(base / 0.5, -1);
  auto expect_logprobs = [&](const SamplingParams& sp, const torch::Tensor& probs, const char* what) {
    auto [tok, lp] = sample_tokens(logits, sp, -1, gen);
    for (int64_t v = 0; v < 4; ++v) {
      const auto is_v = tok == v;
      const double p = probs[v].item<double>();
      const double freq = is_v.to(torch::kFloat64).mean().item<double>();
      // Drawn as often as the distribution says (4 sigma of 6000 draws), and reported as that log-prob.
      EXPECT_NEAR(freq, p, 4 * std::sqrt(std::max(p * (1 - p), 1e-4) / 6000) + 1e-9) << what << " token " << v;
      if (p == 0) {
        EXPECT_EQ(is_v.sum().item<int64_t>(), 0) << what << " token " << v << " is outside the cut";
      } else if (is_v.any().item<bool>()) {
        EXPECT_NEAR(lp.masked_select(is_v)[0].item<float>(), std::log(p), 1e-5) << what << " token " << v;
      }
    }
  };
  SamplingParams sp;
  sp.temperature = 0.5;
  expect_logprobs(sp, tempered, "temperature only");
  sp.top_k = 2;  // the two largest, renormalised
  auto k2 = tempered.clone();
  k2.narrow(0, 2, 2).zero_();
  expect_logprobs(sp, k2 / k2.sum(), "top_k 2");
  sp.top_k = 0;
  sp.top_p = 0.9;  // tempered probabilities 0.865, 0.117, 0.016, 0.002: the first two reach 0.9
  expect_logprobs(sp, k2 / k2.sum(), "top_p 0.9");
  sp.top_k = 3;
  sp.top_p = 0.999;  // top-k first (3 left), then the nucleus of those three: all three
  auto k3 = tempered.clone();
  k3[3] = 0;
  expect_logprobs(sp, k3 / k3.sum(), "top_k 3 then top_p 0.999");
}

TEST(PolicySamplerTest, StopsAtEosAndStopStrings) {
  auto p = qwen();
  const auto tok = Tokenizer::from_file(t::refs_dir() + "/tokenizer_gpt2.json");  // ids < 603; model vocab 384
  Sampler s(p.model, &tok);
  SamplingParams sp;
  sp.max_new_tokens = 16;
  sp.temperature = 0;
  sp.valid_vocab = 384;
  const auto free_run = s.generate(kPrompts, sp);
  // EOS: declare the 3rd generated token of row 0 an EOS id.
  sp.eos_ids = {free_run[0].tokens[2]};
  auto out = s.generate(kPrompts, sp);
  EXPECT_EQ(out[0].finish_reason, "eos");
  EXPECT_LE(out[0].tokens.size(), 3u);
  EXPECT_EQ(out[0].tokens.back(), free_run[0].tokens[2]);
  // Stop string: the text of row 1's tokens 4..5 stops it right after token 5 (or earlier
  // if that text appeared before).
  sp.eos_ids.clear();
  const std::string stop = tok.decode({free_run[1].tokens[4], free_run[1].tokens[5]});
  ASSERT_FALSE(stop.empty());
  sp.stop = {stop};
  sp.check_every = 3;
  out = s.generate(kPrompts, sp);
  EXPECT_EQ(out[1].finish_reason, "stop");
  EXPECT_LE(out[1].tokens.size(), 6u);
  EXPECT_NE(out[1].text.find(stop), std::string::npos);
  EXPECT_EQ(out[1].tokens.size(), out[1].logprobs.size());
  // The tokens before the stop are the free run's.
  for (std::size_t i = 0; i < out[1].tokens.size(); ++i) EXPECT_EQ(out[1].tokens[i], free_run[1].tokens[i]);
}

TEST(PolicySamplerTest, CudaBf16SamplingRuns) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  auto p = load_policy(t::refs_dir() + "/qwen2", torch::kCUDA);
  Sampler s(p.model, nullptr);
  SamplingParams sp;
  sp.max_new_tokens = 8;
  sp.seed = 1;
  const auto a = s.generate(kPrompts, sp), b = s.generate(kPrompts, sp);
  sp.cuda_graph = false;
  const auto c = s.generate(kPrompts, sp);
  for (std::size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].tokens.size(), 8u);
    EXPECT_EQ(a[i].tokens, b[i].tokens);
    EXPECT_EQ(a[i].tokens, c[i].tokens);  // CUDA graph replay = eager static decode
  }
}

TEST(PolicySamplerTest, LoopPeriodFindsABlockRepeatedAtTheEnd) {
  const auto head = distinct(500, 10);
  const auto sp = loop_params(4, 128, 64);
  EXPECT_EQ(loop_period(with_repeats(head, distinct(100, 16), 4), sp), 16);
  EXPECT_EQ(loop_period(with_repeats({}, distinct(100, 16), 4), sp), 16);    // nothing before the loop
  EXPECT_EQ(loop_period(with_repeats(head, distinct(100, 16), 6), sp), 16);  // more repeats: still a loop
  // A block cut anywhere is a loop of its rotation: the end need not fall on a block boundary.
  auto rotated = with_repeats(head, distinct(100, 16), 4, distinct(100, 5));
  EXPECT_EQ(loop_period(rotated, sp), 16);
  // Off.
  EXPECT_EQ(loop_period(with_repeats(head, distinct(100, 16), 8), loop_params(0, 128, 64)), 0);
}

TEST(PolicySamplerTest, LoopPeriodNeedsEnoughRepeats) {
  const auto head = distinct(500, 10);
  auto sp = loop_params(4, 128, 0);
  EXPECT_EQ(loop_period(with_repeats(head, distinct(100, 16), 3), sp), 0);
  EXPECT_EQ(loop_period(with_repeats(head, distinct(100, 16), 4), sp), 16);
  sp.loop_repeats = 2;
  EXPECT_EQ(loop_period(with_repeats(head, distinct(100, 16), 2), sp), 16);
  EXPECT_EQ(loop_period(with_repeats(head, distinct(100, 16), 1), sp), 0);
}

TEST(PolicySamplerTest, LoopPeriodIsAtMostMaxPeriod) {
  const auto tokens = with_repeats(distinct(500, 10), distinct(100, 20), 4);
  EXPECT_EQ(loop_period(tokens, loop_params(4, 19, 64)), 0);
  EXPECT_EQ(loop_period(tokens, loop_params(4, 20, 64)), 20);
}

TEST(PolicySamplerTest, LoopPeriodNeedsTheMinimumSpan) {
  const auto head = distinct(500, 10);
  // 4 repeats of 8 tokens span 32 < 64: not yet a loop; 8 repeats span 64: a loop.
  EXPECT_EQ(loop_period(with_repeats(head, distinct(100, 8), 4), loop_params(4, 128, 64)), 0);
  EXPECT_EQ(loop_period(with_repeats(head, distinct(100, 8), 7), loop_params(4, 128, 64)), 0);
  EXPECT_EQ(loop_period(with_repeats(head, distinct(100, 8), 8), loop_params(4, 128, 64)), 8);
  EXPECT_EQ(loop_period(with_repeats(head, distinct(100, 8), 4), loop_params(4, 128, 32)), 8);
}

TEST(PolicySamplerTest, LoopPeriodIgnoresARepeatNotAtTheEnd) {
  const auto sp = loop_params(4, 128, 64);
  EXPECT_EQ(loop_period(with_repeats(distinct(500, 10), distinct(100, 16), 5, distinct(300, 3)), sp), 0);
  // One changed token near the end breaks it too.
  auto tokens = with_repeats(distinct(500, 10), distinct(100, 16), 5);
  tokens[tokens.size() - 20] = 499;
  EXPECT_EQ(loop_period(tokens, sp), 0);
  EXPECT_EQ(loop_period({}, sp), 0);
}

TEST(PolicySamplerTest, LoopPeriodOfOneTokenRun) {
  const auto head = distinct(500, 10);
  EXPECT_EQ(loop_period(with_repeats(head, {7}, 64), loop_params(4, 128, 64)), 1);
  EXPECT_EQ(loop_period(with_repeats(head, {7}, 63), loop_params(4, 128, 64)), 0);
  EXPECT_EQ(loop_period(with_repeats(head, {7}, 4), loop_params(4, 128, 0)), 1);
  EXPECT_EQ(loop_period(with_repeats(head, {7}, 3), loop_params(4, 128, 0)), 0);
}

TEST(PolicySamplerTest, LoopPeriodIsTheSmallest) {
  // 4 tokens repeated 32 times also repeat with periods 8, 12, ... up to 32: 4 is reported.
  const auto tokens = with_repeats(distinct(500, 10), distinct(100, 4), 32);
  EXPECT_EQ(loop_period(tokens, loop_params(4, 128, 64)), 4);
  EXPECT_EQ(loop_period(tokens, loop_params(4, 128, 0)), 4);
  // A block with an inner repeat ("a b a b c") is reported whole.
  EXPECT_EQ(loop_period(with_repeats(distinct(500, 10), {1, 2, 1, 2, 3}, 4), loop_params(4, 128, 0)), 5);
}

TEST(PolicySamplerTest, LoopParamsAreValidated) {
  auto p = qwen();
  Sampler s(p.model, nullptr);
  auto expect_error = [&](const SamplingParams& sp, const std::string& field) {
    try {
      s.generate(kPrompts, sp);
      ADD_FAILURE() << "no error for " << field;
    } catch (const kf::Error& e) {
      EXPECT_NE(std::string(e.what()).find(field), std::string::npos) << e.what();
    }
  };
  auto sp = loop_params(1, 128, 64);
  sp.max_new_tokens = 4;
  expect_error(sp, "loop_repeats");
  sp.loop_repeats = -1;
  expect_error(sp, "loop_repeats");
  sp.loop_repeats = 4;
  sp.loop_max_period = 0;
  expect_error(sp, "loop_max_period");
  sp.loop_max_period = -3;
  expect_error(sp, "loop_max_period");
  sp.loop_max_period = 128;
  sp.loop_min_span = -1;
  expect_error(sp, "loop_min_span");
  sp.loop_min_span = 0;
  EXPECT_NO_THROW(s.generate(kPrompts, sp));
}

// Greedy decoding of the tiny random model falls into loops, as the shipped policy does:
// with the loop stop those rows end early ("loop") right where the loop completed, every
// other row is unchanged, and the cut does not depend on check_every.
TEST(PolicySamplerTest, GreedyLoopsStopEarly) {
  auto p = qwen();
  Sampler s(p.model, nullptr);
  const auto prompts = loop_prompts();
  SamplingParams sp;
  sp.max_new_tokens = 240;  // prompts + completion within the model's 256 positions
  sp.temperature = 0;
  const auto free_run = s.generate(prompts, sp);
  sp.loop_repeats = 4;  // the actors' defaults otherwise: period <= 128, span >= 64
  const auto out = s.generate(prompts, sp);
  sp.check_every = 1;
  const auto every_token = s.generate(prompts, sp);
  ASSERT_EQ(out.size(), prompts.size());
  int loops = 0, others = 0;
  for (std::size_t i = 0; i < out.size(); ++i) {
    const auto& f = free_run[i];
    const auto& c = out[i];
    EXPECT_EQ(f.finish_reason, "length");
    EXPECT_EQ(f.tokens.size(), 240u);
    EXPECT_EQ(c.tokens, every_token[i].tokens) << "row " << i;
    EXPECT_EQ(c.finish_reason, every_token[i].finish_reason) << "row " << i;
    ASSERT_EQ(c.tokens.size(), c.logprobs.size());
    ASSERT_LE(c.tokens.size(), f.tokens.size());
    // Always a prefix of what was sampled, log-probs included.
    EXPECT_TRUE(std::equal(c.tokens.begin(), c.tokens.end(), f.tokens.begin())) << "row " << i;
    EXPECT_TRUE(std::equal(c.logprobs.begin(), c.logprobs.end(), f.logprobs.begin())) << "row " << i;
    if (c.finish_reason == "loop") {
      ++loops;
      EXPECT_LT(c.tokens.size(), 240u);
      // The tokens end with the repeated block, and the token before the end did not yet.
      const int64_t per = loop_period(c.tokens, sp);
      EXPECT_GT(per, 0) << "row " << i;
      const std::vector<int32_t> before(c.tokens.begin(), c.tokens.end() - 1);
      EXPECT_EQ(loop_period(before, sp), 0) << "row " << i;
      const auto n = static_cast<int64_t>(c.tokens.size());
      for (int64_t j = n - std::max<int64_t>(4 * per, 64); j + per < n; ++j)
        EXPECT_EQ(c.tokens[j], c.tokens[j + per]) << "row " << i;
    } else {
      ++others;
      EXPECT_EQ(c.finish_reason, "length") << "row " << i;
      EXPECT_EQ(c.tokens, f.tokens) << "row " << i;
      for (std::size_t m = 1; m <= f.tokens.size(); ++m)
        EXPECT_EQ(loop_period(std::vector<int32_t>(f.tokens.begin(), f.tokens.begin() + m), sp), 0) << "row " << i;
    }
  }
  ASSERT_GT(loops, 0) << "no greedy row of the tiny model looped within 240 tokens: pick other prompts";
  ASSERT_GT(others, 0) << "every greedy row looped: pick prompts where some do not, to see them unchanged";
}

// Sampled rows: one ends at EOS, the loop stop leaves every row that does not loop as it
// was (the batch still draws the same random numbers for them), and one that loops keeps
// a prefix.
TEST(PolicySamplerTest, LoopStopLeavesOtherRowsUnchanged) {
  auto p = qwen();
  Sampler s(p.model, nullptr);
  const auto prompts = loop_prompts();
  SamplingParams sp;
  sp.max_new_tokens = 200;
  sp.temperature = 0.1;  // low enough for some rows to loop
  sp.seed = 21;
  sp.loop_min_span = 32;
  const auto free_run = s.generate(prompts, sp);
  sp.loop_repeats = 4;
  const auto loop_run = s.generate(prompts, sp);
  // Declare row 0's 50th token an EOS id (if it had looped by then, that row keeps "loop").
  sp.eos_ids = {free_run[0].tokens[49]};
  sp.loop_repeats = 0;
  const auto free_eos = s.generate(prompts, sp);
  sp.loop_repeats = 4;
  const auto out = s.generate(prompts, sp);
  int loops = 0, eos = 0, length = 0;
  for (std::size_t i = 0; i < out.size(); ++i) {
    const auto& c = out[i];
    if (c.finish_reason == "loop") {
      ++loops;
      EXPECT_EQ(c.tokens, loop_run[i].tokens) << "row " << i;
      EXPECT_TRUE(std::equal(c.tokens.begin(), c.tokens.end(), free_run[i].tokens.begin())) << "row " << i;
      EXPECT_LT(c.tokens.size(), free_eos[i].tokens.size()) << "row " << i;
    } else {
      EXPECT_EQ(c.finish_reason, free_eos[i].finish_reason) << "row " << i;
      EXPECT_EQ(c.tokens, free_eos[i].tokens) << "row " << i;
      EXPECT_EQ(c.logprobs, free_eos[i].logprobs) << "row " << i;
      eos += c.finish_reason == "eos";
      length += c.finish_reason == "length";
    }
  }
  EXPECT_GT(loops, 0) << "no sampled row looped at temperature 0.1: pick another seed";
  EXPECT_GT(eos, 0) << "no row ended at EOS";
  EXPECT_GT(length, 0) << "no row ran to max_new_tokens";
}

// A stop string that completes before the loop does ends the row as "stop".
TEST(PolicySamplerTest, StopStringBeforeTheLoopWins) {
  auto p = qwen();
  const auto tok = Tokenizer::from_file(t::refs_dir() + "/tokenizer_gpt2.json");
  Sampler s(p.model, &tok);
  const auto prompts = loop_prompts();
  SamplingParams sp;
  sp.max_new_tokens = 240;
  sp.temperature = 0;
  sp.valid_vocab = 384;
  sp.loop_repeats = 4;
  const auto out = s.generate(prompts, sp);
  std::size_t r = 0;
  while (r < out.size() && out[r].finish_reason != "loop") ++r;
  ASSERT_LT(r, out.size()) << "no greedy row looped";
  // The text of the loop's last block appeared (at least) one block earlier.
  const auto& c = out[r];
  const auto per = loop_period(c.tokens, sp);
  const std::string stop = tok.decode(std::vector<int32_t>(c.tokens.end() - per, c.tokens.end()));
  ASSERT_FALSE(stop.empty());
  sp.stop = {stop};
  const auto stopped = s.generate(prompts, sp);
  EXPECT_EQ(stopped[r].finish_reason, "stop");
  EXPECT_LT(stopped[r].tokens.size(), c.tokens.size());
  EXPECT_NE(stopped[r].text.find(stop), std::string::npos);
}
