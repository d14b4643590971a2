// rollout_group: the one sample -> text -> kernel path of actors, tools/optimize and
// tools/selfsup. A memorised completion comes back as its text (no end-of-sequence byte)
// with its kernel extracted under the caller's fence marker.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "kf/actors/actors.h"
#include "test_util.h"

using namespace kf::actors;

TEST(RolloutTest, CompletionTextDropsOnlyTheStoppingEndOfSequence) {
  const auto codec = TextCodec::bytes();
  kf::policy::Completion c;
  c.tokens = {'o', 'k', 0};
  c.finish_reason = "eos";
  EXPECT_EQ(completion_text(codec, c), "ok");
  c.tokens = {'o', 'k'};
  c.finish_reason = "length";  // cut by the token budget: every token is text
  EXPECT_EQ(completion_text(codec, c), "ok");
}

TEST(RolloutTest, MemorisedKernelIsSampledDecodedAndExtractedWithTheCallersMarker) {
  auto pol = test::tiny_policy(11);
  const std::vector<int32_t> prompt = {'w', 'r', 'i', 't', 'e', ':'};
  const std::string body = "extern \"C\" int kf_forward(){return 0;}";
  const std::string completion = "```cpp kernel\n" + body + "\n```\n";
  ASSERT_GE(test::memorise(pol.model, prompt, completion, 1.0f), 0) << "the tiny model did not memorise the text";
  kf::policy::SamplingParams sp;
  sp.temperature = 0.05;
  sp.top_k = 4;  // top-k is honoured on every caller's path
  sp.max_new_tokens = 64;
  sp.eos_ids = pol.eos_ids;
  sp.seed = 3;
  ExtractOptions marked;
  marked.marker = "kernel";
  const auto got = rollout_group(pol.model, pol.codec, prompt, 3, sp, pol.valid_vocab, marked);
  ASSERT_EQ(got.size(), 3u);
  for (const auto& r : got) {
    EXPECT_EQ(r.completion.finish_reason, "eos");
    EXPECT_EQ(r.text, completion) << "the stopping end-of-sequence token is not part of the text";
    EXPECT_EQ(r.completion.tokens.size(), completion.size() + 1);
    ASSERT_TRUE(r.kernel.ok) << r.kernel.error;
    EXPECT_EQ(r.kernel.source, body + "\n");
  }
  ExtractOptions other;
  other.marker = "cuda_only";
  other.allow_unmarked = false;
  const auto refused = rollout_group(pol.model, pol.codec, prompt, 1, sp, pol.valid_vocab, other);
  ASSERT_EQ(refused.size(), 1u);
  EXPECT_FALSE(refused[0].kernel.ok);
  EXPECT_EQ(refused[0].kernel.error.rfind("extract: ", 0), 0u) << refused[0].kernel.error;
}

// The importance ratio compares the learner's log-probs with the behaviour log-probs the
// sampler reported. Those are the log-probs of the distribution each token was drawn from:
// with top-k and top-p active, the cut and renormalised tempered distribution (one full
// forward through policy::sampling_logits gives them, to float rounding); with no cut, the
// learner's own recompute through the chunked head at completion positions.
TEST(RolloutTest, BehaviourLogprobsAreTheSampledDistributionsAndTheLearnersWithoutACut) {
  auto pol = test::tiny_policy(21);
  const std::vector<int32_t> prompt = {'a', 'b', 'c', 'd', 'e'};
  for (const bool cut : {true, false}) {
    kf::policy::SamplingParams sp;
    sp.temperature = 0.7;
    sp.top_k = cut ? 8 : 0;
    sp.top_p = cut ? 0.9 : 1.0;
    sp.max_new_tokens = 24;
    sp.eos_ids = {};
    sp.seed = 5;
    ExtractOptions ex;
    const auto got = rollout_group(pol.model, pol.codec, prompt, 3, sp, pol.valid_vocab, ex);
    ASSERT_EQ(got.size(), 3u);
    torch::NoGradGuard g;
    for (const auto& r : got) {
      ASSERT_EQ(r.completion.logprobs.size(), r.completion.tokens.size());
      EXPECT_LT(
          test::sampler_logprob_gap(pol.model, prompt, r.completion.tokens, r.completion.logprobs, sp, pol.valid_vocab),
          1e-4)
          << (cut ? "top-k 8, top-p 0.9" : "no cut");
      std::vector<int64_t> ids(prompt.begin(), prompt.end());
      ids.insert(ids.end(), r.completion.tokens.begin(), r.completion.tokens.end());
      const int64_t T = static_cast<int64_t>(ids.size()), P = static_cast<int64_t>(prompt.size());
      auto wanted = torch::zeros({1, T - 1}, torch::kBool);
      wanted.narrow(1, P - 1, T - P).fill_(true);  // position p predicts token p + 1
      const auto lp = pol.model
                          ->selected_logprobs(torch::tensor(ids).unsqueeze(0), torch::ones({1, T}, torch::kLong),
                                              wanted, sp.temperature, /*chunk=*/7)
                          .logp;
      double worst = 0, below = 0;
      for (int64_t t = 0; t < T - P; ++t) {
        const double d = r.completion.logprobs[static_cast<std::size_t>(t)] - lp[0][P - 1 + t].item<double>();
        worst = std::max(worst, std::abs(d));
        below = std::min(below, d);
      }
      if (cut) {
        // The cut renormalises over fewer tokens: never below the learner's, and above it somewhere.
        EXPECT_GT(below, -1e-4);
        EXPECT_GT(worst, 1e-3) << "top-k 8 of a 256-token vocabulary cut nothing";
      } else {
        EXPECT_LT(worst, 1e-4) << "without a cut the behaviour log-probs are the learner's";
      }
    }
  }
}
