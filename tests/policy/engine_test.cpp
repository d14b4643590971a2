// Engine (kf/policy/policy.h): continuous batching over a paged KV cache must not change what is
// sampled. Greedy tokens equal group-at-a-time decoding (policy::Sampler with the shared
// prefill) for prompts of several lengths decoded concurrently, padding to batch buckets
// changes nothing, log-probs equal the learner's recomputation under top-k/top-p, admission
// waits for blocks, and every block returns to the pool.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>

#include "kf/common/error.h"
#include "kf/policy/policy.h"

using namespace kf::policy;

namespace {

// A tiny fp32 model with weights large enough (std 0.2) that greedy choices are not ties.
CausalLM tiny_model(uint64_t seed, bool qwen3 = false) {
  auto c = named_model_shape("tiny");
  if (qwen3) {  // per-head q/k norms, no q/k/v bias, head_dim 24 (heads x head_dim != hidden)
    c.model_type = "qwen3";
    c.qk_norm = true;
    c.qkv_bias = false;
    c.head_dim = 24;
  }
  CausalLM m(c, torch::TensorOptions().dtype(torch::kFloat32));
  m->init_random(seed, 0.2);
  m->eval();
  return m;
}

std::vector<int32_t> prompt_of(int64_t len, int32_t salt) {
  std::vector<int32_t> p;
  for (int64_t i = 0; i < len; ++i) p.push_back(static_cast<int32_t>((i * 37 + salt * 11 + 5) % 256));
  return p;
}

// Prompts whose lengths hit a block boundary (8), leave a partial block (5, 13, 21) and
// span several blocks, each with its own completion budget so rows leave at different steps.
struct Case {
  std::vector<int32_t> prompt;
  int64_t n, max_new;
};
std::vector<Case> cases() {
  return {{prompt_of(5, 1), 3, 17},  {prompt_of(13, 2), 2, 9}, {prompt_of(8, 3), 3, 23},
          {prompt_of(21, 4), 1, 12}, {prompt_of(2, 5), 2, 30}, {prompt_of(17, 6), 3, 6}};
}

SamplingParams greedy(int64_t max_new) {
  SamplingParams p;
  p.temperature = 0;
  p.max_new_tokens = max_new;
  p.valid_vocab = 256;
  return p;
}

std::map<uint64_t, EngineResult> run(Engine& e, const std::vector<Case>& cs, const SamplingParams& base) {
  for (std::size_t i = 0; i < cs.size(); ++i) {
    EngineRequest r;
    r.id = 100 + i;
    r.prompt = cs[i].prompt;
    r.n = cs[i].n;
    r.sampling = base;
    r.sampling.max_new_tokens = cs[i].max_new;
    e.submit(r);
  }
  std::map<uint64_t, EngineResult> out;
  for (auto& r : e.run_all()) out[r.id] = std::move(r);
  return out;
}

EngineOptions small_pool() {
  EngineOptions o;
  o.block_size = 4;
  o.kv_budget_mb = 1;
  o.max_sequences = 5;  // fewer than the 14 samples: later requests join as rows leave
  o.check_every = 3;
  return o;
}

}  // namespace

static void check_greedy_equals_group_at_a_time(CausalLM m) {
  Engine e(m, small_pool());
  const auto cs = cases();
  const auto got = run(e, cs, greedy(0));
  ASSERT_EQ(got.size(), cs.size());
  Sampler s(m, nullptr);
  for (std::size_t i = 0; i < cs.size(); ++i) {
    SamplingParams p = greedy(cs[i].max_new);
    p.shared_prefill = true;
    const auto want = s.generate(std::vector<std::vector<int32_t>>(cs[i].n, cs[i].prompt), p);
    const auto& r = got.at(100 + i);
    ASSERT_EQ(r.completions.size(), want.size());
    for (std::size_t k = 0; k < want.size(); ++k) {
      EXPECT_EQ(r.completions[k].tokens, want[k].tokens) << "request " << i << " sample " << k;
      EXPECT_EQ(r.completions[k].finish_reason, "length");
      ASSERT_EQ(r.completions[k].logprobs.size(), want[k].logprobs.size());
      for (std::size_t t = 0; t < want[k].logprobs.size(); ++t)
        EXPECT_NEAR(r.completions[k].logprobs[t], want[k].logprobs[t], 1e-4) << "request " << i << " token " << t;
    }
  }
  const auto st = e.stats();
  EXPECT_EQ(st.blocks_free, st.blocks_total) << "every KV block returns to the pool";
  EXPECT_GT(st.cow_copies, 0) << "samples sharing a partial prompt block copy it before writing";
  EXPECT_LE(st.blocks_peak_used, st.blocks_total);
  EXPECT_TRUE(e.idle());
  // Prefill once per request, not once per sample.
  int64_t prompt_tokens = 0;
  for (const auto& c : cs) prompt_tokens += static_cast<int64_t>(c.prompt.size());
  EXPECT_EQ(st.prefill_tokens, prompt_tokens);
}

TEST(EngineTest, GreedyEqualsGroupAtATimeDecodingForConcurrentPromptsOfDifferentLengths) {
  check_greedy_equals_group_at_a_time(tiny_model(3));
}

// The engine's decode projects q, k and v as the model does (AttentionImpl::project): a Qwen3
// shape's per-head norms are applied on both paths.
TEST(EngineTest, Qwen3GreedyEqualsGroupAtATimeDecoding) {
  check_greedy_equals_group_at_a_time(tiny_model(3, /*qwen3=*/true));
}

TEST(EngineTest, PaddingToBatchBucketsDoesNotChangeResults) {
  auto m = tiny_model(4);
  SamplingParams sampled;
  sampled.temperature = 0.8;
  sampled.top_k = 20;
  sampled.valid_vocab = 256;
  for (const auto& base : {greedy(0), sampled}) {
    auto plain = small_pool();
    plain.seed = 9;
    auto padded = plain;
    padded.pad_batch = true;
    padded.batch_buckets = {8};  // every step runs 8 rows, 3 to 5 of them padding
    Engine a(m, plain), b(m, padded);
    const auto ra = run(a, cases(), base), rb = run(b, cases(), base);
    EXPECT_EQ(a.stats().padded_rows, 0);
    EXPECT_GT(b.stats().padded_rows, 0);
    ASSERT_EQ(ra.size(), rb.size());
    for (const auto& [id, r] : ra) {
      const auto& q = rb.at(id);
      for (std::size_t k = 0; k < r.completions.size(); ++k) {
        EXPECT_EQ(r.completions[k].tokens, q.completions[k].tokens) << "request " << id << " sample " << k;
        for (std::size_t t = 0; t < r.completions[k].logprobs.size(); ++t)
          EXPECT_NEAR(r.completions[k].logprobs[t], q.completions[k].logprobs[t], 1e-5);
      }
    }
    EXPECT_EQ(b.stats().blocks_free, b.stats().blocks_total);
  }
}

// The engine reports the log-probs of the distribution it sampled from: the tempered
// distribution cut by top-k and top-p and renormalised (sampling_logits of one full
// forward); without a cut those are the learner's recomputed log-probs.
TEST(EngineTest, LogprobsAreTheSampledDistributionsAndTheLearnersWithoutACut) {
  auto m = tiny_model(5);
  for (const bool cut : {true, false}) {
    SamplingParams p;
    p.temperature = 0.7;
    p.top_k = cut ? 8 : 0;
    p.top_p = cut ? 0.9 : 1.0;
    p.valid_vocab = 256;
    Engine e(m, small_pool());
    const auto cs = cases();
    const auto got = run(e, cs, p);
    torch::NoGradGuard g;
    for (std::size_t i = 0; i < cs.size(); ++i)
      for (const auto& c : got.at(100 + i).completions) {
        std::vector<int64_t> ids(cs[i].prompt.begin(), cs[i].prompt.end());
        ids.insert(ids.end(), c.tokens.begin(), c.tokens.end());
        const int64_t T = static_cast<int64_t>(ids.size()), P = static_cast<int64_t>(cs[i].prompt.size());
        ASSERT_EQ(c.logprobs.size(), c.tokens.size());
        const auto logits = m->forward(torch::tensor(ids).unsqueeze(0)).narrow(1, P - 1, T - P).squeeze(0);
        const auto sampled = torch::log_softmax(sampling_logits(logits, p, p.valid_vocab), -1);
        auto wanted = torch::zeros({1, T - 1}, torch::kBool);
        wanted.narrow(1, P - 1, T - P).fill_(true);
        const auto learner = m->selected_logprobs(torch::tensor(ids).unsqueeze(0), torch::ones({1, T}, torch::kLong),
                                                  wanted, p.temperature, /*chunk=*/7)
                                 .logp;
        for (int64_t t = 0; t < T - P; ++t) {
          const double got_lp = c.logprobs[static_cast<std::size_t>(t)];
          EXPECT_NEAR(sampled[t][ids[static_cast<std::size_t>(P + t)]].item<double>(), got_lp, 1e-4)
              << "request " << i << " token " << t << (cut ? " (top-k 8, top-p 0.9)" : "");
          if (!cut)
            EXPECT_NEAR(learner[0][P - 1 + t].item<double>(), got_lp, 1e-4) << "request " << i << " token " << t;
        }
      }
  }
}

TEST(EngineTest, AdmissionWaitsForFreeBlocks) {
  auto m = tiny_model(6);
  EngineOptions o;
  o.block_size = 4;
  // tiny: 2 layers x K,V x 4 tokens x 2 kv heads x 16 dims x 4 bytes = 2 KiB a block.
  o.kv_budget_mb = 1;  // 512 blocks, 511 usable
  o.max_sequences = 64;
  Engine e(m, o);
  EXPECT_EQ(e.stats().block_bytes, 2048);
  // One request: prompt 3 blocks + 45 samples x 6 own blocks = 273 blocks: the second
  // waits until the first has finished and freed its blocks.
  for (uint64_t id : {1, 2}) {
    EngineRequest r;
    r.id = id;
    r.prompt = prompt_of(10, static_cast<int32_t>(id));
    r.n = 45;
    r.sampling = greedy(20);
    e.submit(r);
  }
  const auto first = e.step();
  ASSERT_EQ(first.size(), 1u);
  EXPECT_EQ(first[0].id, 1u);
  EXPECT_EQ(e.stats().running_requests, 0) << "the second request is not admitted before the first ends";
  EXPECT_EQ(e.stats().waiting, 1);
  const auto second = e.run_all();
  ASSERT_EQ(second.size(), 1u);
  EXPECT_GE(second[0].queued_s, first[0].latency_s * 0.5);
  EXPECT_EQ(e.stats().blocks_free, e.stats().blocks_total);
  // A request that can never fit is refused at submit, naming the budget key.
  EngineRequest big;
  big.id = 3;
  big.prompt = prompt_of(10, 3);
  big.n = 100;
  big.sampling = greedy(40);
  try {
    e.submit(big);
    FAIL() << "a request over the KV budget was accepted";
  } catch (const kf::Error& err) {
    EXPECT_NE(std::string(err.what()).find("kv_budget_mb"), std::string::npos) << err.what();
  }
}

TEST(EngineTest, EosOnTheFirstTokenAndLoopsEndSequences) {
  auto m = tiny_model(7);
  Engine e(m, small_pool());
  EngineRequest r;
  r.id = 1;
  r.prompt = prompt_of(6, 1);
  r.n = 3;
  r.sampling = greedy(10);
  for (int64_t t = 0; t < 256; ++t) r.sampling.eos_ids.push_back(t);  // every token ends it
  e.submit(r);
  EngineRequest l = r;
  l.id = 2;
  l.sampling.eos_ids.clear();
  l.sampling.max_new_tokens = 200;
  l.sampling.loop_repeats = 2;  // greedy decoding of a tiny model settles into a cycle
  l.sampling.loop_min_span = 4;
  e.submit(l);
  std::map<uint64_t, EngineResult> got;
  for (auto& x : e.run_all()) got[x.id] = std::move(x);
  for (const auto& c : got.at(1).completions) {
    EXPECT_EQ(c.finish_reason, "eos");
    EXPECT_EQ(c.tokens.size(), 1u);
  }
  Sampler s(m, nullptr);
  auto p = l.sampling;
  p.shared_prefill = true;
  const auto want = s.generate({l.prompt, l.prompt, l.prompt}, p);
  for (std::size_t k = 0; k < 3; ++k) {
    EXPECT_EQ(got.at(2).completions[k].tokens, want[k].tokens);
    EXPECT_EQ(got.at(2).completions[k].finish_reason, want[k].finish_reason);
  }
  EXPECT_EQ(e.stats().blocks_free, e.stats().blocks_total);
}

TEST(EngineTest, BadOptionsAndRequestsAreRefusedWithTheirName) {
  auto m = tiny_model(8);
  auto expect_error = [](auto f, const std::string& needle) {
    try {
      f();
      FAIL() << "no error for " << needle;
    } catch (const kf::Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  EngineOptions o;
  o.block_size = 0;
  expect_error([&] { Engine e(m, o); }, "actors.engine.block_size");
  o = EngineOptions();
  o.max_sequences = 0;
  expect_error([&] { Engine e(m, o); }, "actors.engine.max_sequences");
  o = EngineOptions();
  o.kv_budget_mb = 0;
  expect_error([&] { Engine e(m, o); }, "actors.engine.kv_budget_mb");
  Engine e(m, small_pool());
  EngineRequest r;
  r.id = 7;
  expect_error([&] { e.submit(r); }, "request 7: empty prompt");
  r.prompt = {1, 2, 999};
  expect_error([&] { e.submit(r); }, "outside the vocab");
  r.prompt = {1, 2};
  r.sampling.stop = {"x"};
  expect_error([&] { e.submit(r); }, "stop strings");
  EXPECT_TRUE(e.idle());
}

TEST(EngineTest, CudaBf16EngineMatchesGroupAtATimeGreedy) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  auto c = named_model_shape("tiny");
  CausalLM m(c, torch::TensorOptions().dtype(torch::kBFloat16).device(torch::kCUDA));
  m->init_random(3, 0.2);
  m->eval();
  EngineOptions o = small_pool();
  o.max_sequences = 8;
  Engine e(m, o);
  const auto cs = cases();
  const auto got = run(e, cs, greedy(0));
  EXPECT_GT(e.stats().graphs_captured, 0);
  EXPECT_EQ(e.stats().blocks_free, e.stats().blocks_total);
  Sampler s(m, nullptr);
  int64_t same = 0, total = 0;
  for (std::size_t i = 0; i < cs.size(); ++i) {
    SamplingParams p = greedy(cs[i].max_new);
    p.shared_prefill = true;
    const auto want = s.generate(std::vector<std::vector<int32_t>>(cs[i].n, cs[i].prompt), p);
    for (std::size_t k = 0; k < want.size(); ++k) {
      ++total;
      same += got.at(100 + i).completions[k].tokens == want[k].tokens;
    }
  }
  // bf16 attention over differently padded keys rounds differently, so a near-tie may go
  // the other way; a wrong cache (block table, copy-on-write, graph inputs) breaks nearly
  // every completion within a few tokens.
  EXPECT_GE(same * 2, total) << same << " of " << total << " completions equal";
}
