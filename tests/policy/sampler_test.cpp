// Sampler: KV-cache generation agrees with full forwards; seeded; stops; masks padding.
#include <gtest/gtest.h>

#include "kf/policy/checkpoint.h"
#include "kf/policy/sampler.h"
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
  // Log-probs are those of the untruncated distribution.
  EXPECT_NEAR(lp[0].item<float>(), std::log(tok[0].item<int64_t>() == 0 ? 0.5 : 0.3), 1e-5);
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
