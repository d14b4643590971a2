// The libtorch model against HF transformers' fp32 logits (tests/policy/hf_reference.py).
#include <gtest/gtest.h>

#include <limits>

#include "kf/common/error.h"
#include "kf/policy/policy.h"
#include "checkpoint.h"
#include "layers.h"
#include "torch_util.h"

using namespace kf::policy;
namespace t = kf::policy::test;

namespace {

constexpr double kTol = 1e-4;

struct Loaded {
  Policy p;
  torch::Tensor ids, logits, mask, logits_pad;
};

Loaded load(const std::string& name) {
  torch::manual_seed(0);
  Loaded l;
  const std::string dir = t::refs_dir() + "/" + name;
  l.p = load_policy(dir, torch::kCPU);
  const std::string refs = t::refs_dir() + "/" + (name == "qwen2_sharded" ? "qwen2" : name) + "/refs.safetensors";
  l.ids = t::load_tensor(refs, "ids");
  l.logits = t::load_tensor(refs, "logits");
  l.mask = t::load_tensor(refs, "mask");
  l.logits_pad = t::load_tensor(refs, "logits_pad");
  l.p.model->eval();
  return l;
}

void check_full(const std::string& name) {
  auto l = load(name);
  torch::NoGradGuard g;
  const auto ours = l.p.model->forward(l.ids);
  ASSERT_EQ(ours.sizes(), l.logits.sizes());
  EXPECT_LT(t::max_abs_diff(ours, l.logits), kTol) << name;
}

// Prefill of 5 tokens, then one token at a time through the KV cache.
void check_cached(const std::string& name) {
  auto l = load(name);
  torch::NoGradGuard g;
  auto& m = l.p.model;
  const int64_t B = l.ids.size(0), T = l.ids.size(1);
  KVCache cache = KVCache::create(m->config(), B, T, m->options());
  std::vector<torch::Tensor> parts{m->logits(m->hidden(l.ids.narrow(1, 0, 5), {}, &cache))};
  for (int64_t i = 5; i < T; ++i) parts.push_back(m->logits(m->hidden(l.ids.narrow(1, i, 1), {}, &cache)));
  EXPECT_LT(t::max_abs_diff(torch::cat(parts, 1), l.logits), kTol) << name;
}

// Row 1 is left-padded by 4; only real tokens are compared.
void check_padded(const std::string& name, bool cached) {
  auto l = load(name);
  torch::NoGradGuard g;
  auto& m = l.p.model;
  torch::Tensor ours;
  if (cached) {
    KVCache cache = KVCache::create(m->config(), 2, 12, m->options());
    auto a = m->logits(m->hidden(l.ids.narrow(1, 0, 8), l.mask.narrow(1, 0, 8), &cache));
    std::vector<torch::Tensor> parts{a};
    for (int64_t i = 8; i < 12; ++i) parts.push_back(m->logits(m->hidden(l.ids.narrow(1, i, 1), {}, &cache)));
    ours = torch::cat(parts, 1);
  } else {
    ours = m->forward(l.ids, l.mask);
  }
  const auto keep = l.mask.to(torch::kBool).unsqueeze(-1);
  EXPECT_LT(t::max_abs_diff(ours.masked_fill(~keep, 0), l.logits_pad.masked_fill(~keep, 0)), kTol) << name;
}

}  // namespace

TEST(PolicyModelTest, Qwen2LogitsMatchHf) { check_full("qwen2"); }

// A shape can be built on the meta device (no memory) to count its parameters: Qwen3-8B's
// config.json (configs/shapes/qwen3-8b.json) gives the model card's 8.19 B, 192.9 M per layer.
TEST(PolicyModelTest, BuildsOnTheMetaDeviceWithItsPublishedSize) {
  const auto c = load_model_config(t::source_dir() + "/configs/shapes/qwen3-8b.json");
  CausalLM model(c, torch::TensorOptions().device(torch::kMeta));
  int64_t total = 0;
  for (const auto& p : model->parameters()) total += p.numel();
  EXPECT_EQ(total, 8190735360);
  EXPECT_EQ((total - 2 * c.vocab_size * c.hidden_size - c.hidden_size) / c.num_hidden_layers, 192946432);
}
TEST(PolicyModelTest, LlamaLogitsMatchHf) { check_full("llama"); }
TEST(PolicyModelTest, ShardedCheckpointLogitsMatchHf) { check_full("qwen2_sharded"); }
TEST(PolicyModelTest, Qwen2KvCacheMatchesHf) { check_cached("qwen2"); }
TEST(PolicyModelTest, LlamaKvCacheMatchesHf) { check_cached("llama"); }
// Qwen3: per-head q/k norms, no q/k/v bias (untied), attention_bias on q/k/v/o (tied).
TEST(PolicyModelTest, Qwen3LogitsMatchHf) {
  check_full("qwen3");
  check_full("qwen3_tied");
}
TEST(PolicyModelTest, Qwen3KvCacheMatchesHf) {
  check_cached("qwen3");
  check_cached("qwen3_tied");
}
TEST(PolicyModelTest, LeftPaddedBatchMatchesHf) {
  check_padded("qwen2", false);
  check_padded("llama", false);
  check_padded("qwen3", false);
}
TEST(PolicyModelTest, LeftPaddedKvCacheMatchesHf) {
  check_padded("qwen2", true);
  check_padded("llama", true);
  check_padded("qwen3", true);
}

TEST(PolicyModelTest, Qwen3HasPerHeadNormsAndNoQkvBias) {
  auto l = load("qwen3");
  std::set<std::string> names;
  for (const auto& p : l.p.model->named_parameters()) names.insert(p.key());
  EXPECT_TRUE(names.count("model.layers.1.self_attn.q_norm.weight"));
  EXPECT_TRUE(names.count("model.layers.1.self_attn.k_norm.weight"));
  EXPECT_FALSE(names.count("model.layers.1.self_attn.q_proj.bias"));
  EXPECT_EQ(l.p.model->named_parameters()["model.layers.0.self_attn.q_norm.weight"].sizes(),
            torch::IntArrayRef({24}));  // head_dim, not hidden / heads
  auto tied = load("qwen3_tied");
  std::set<std::string> tnames;
  for (const auto& p : tied.p.model->named_parameters()) tnames.insert(p.key());
  EXPECT_TRUE(tnames.count("model.layers.2.self_attn.o_proj.bias"));
  EXPECT_FALSE(tnames.count("lm_head.weight"));
}

TEST(PolicyModelTest, ParameterNamesAreHfNames) {
  auto l = load("qwen2");
  std::set<std::string> names;
  for (const auto& p : l.p.model->named_parameters()) names.insert(p.key());
  EXPECT_TRUE(names.count("model.embed_tokens.weight"));
  EXPECT_TRUE(names.count("model.layers.1.self_attn.q_proj.bias"));
  EXPECT_TRUE(names.count("model.layers.0.mlp.gate_proj.weight"));
  EXPECT_TRUE(names.count("model.norm.weight"));
  EXPECT_TRUE(names.count("lm_head.weight"));
  auto ll = load("llama");
  for (const auto& p : ll.p.model->named_parameters()) EXPECT_EQ(p.key().find("lm_head"), std::string::npos);  // tied
}

TEST(PolicyModelTest, TokenLogprobsMatchLogits) {
  auto l = load("qwen2");
  torch::NoGradGuard g;
  const auto lp = l.p.model->token_logprobs(l.ids, {}, 0.7);
  const auto ref = torch::log_softmax(l.logits.narrow(1, 0, 11) / 0.7, -1)
                       .gather(-1, l.ids.narrow(1, 1, 11).unsqueeze(-1))
                       .squeeze(-1);
  EXPECT_LT(t::max_abs_diff(lp, ref), kTol);
}

// Every layer recomputed, only the first (selective recomputation), or none: the same
// gradients as keeping every activation.
TEST(PolicyModelTest, GradientCheckpointingGivesSameGradients) {
  auto l = load("llama");
  auto& m = l.p.model;
  ASSERT_GE(m->model->layers->size(), 2u) << "selective recomputation needs a kept and a recomputed layer";
  auto grads = [&](bool ckpt, int64_t layers) {
    m->zero_grad();
    m->set_gradient_checkpointing(ckpt);
    m->set_recompute_layers(layers);
    m->token_logprobs(l.ids, l.mask).sum().backward();
    std::vector<torch::Tensor> out;
    for (const auto& p : m->parameters()) out.push_back(p.grad().clone());
    return out;
  };
  const auto a = grads(false, -1);
  for (int64_t layers : {-1, 1, 0}) {
    SCOPED_TRACE("recompute_layers " + std::to_string(layers));
    const auto b = grads(true, layers);
    ASSERT_EQ(a.size(), b.size());
    double worst = 0, norm = 0;
    for (std::size_t i = 0; i < a.size(); ++i) {
      worst = std::max(worst, t::max_abs_diff(a[i], b[i]));
      norm = std::max(norm, a[i].abs().max().item<double>());
    }
    EXPECT_GT(norm, 1e-3);
    EXPECT_LT(worst, 1e-5);
  }
}

// ParamHooks (the learner's ZeRO-3): a decoder layer's weights are read only between
// pre_forward(l) and post_forward(l), and after pre_backward(l). These hooks fill a layer's
// weights with NaN outside those windows (through .data(), so autograd's version checks do
// not see it): the log-probs and every gradient must still be exactly those of a run
// without hooks, with and without recomputation, and the calls come in layer order.
namespace {
struct HidingHooks : ParamHooks {
  std::vector<std::vector<torch::Tensor>> params, saved;
  std::vector<std::string> calls;
  explicit HidingHooks(CausalLMImpl& m) {
    for (std::size_t l = 0; l < m.model->layers->size(); ++l) {
      params.emplace_back(m.model->layers[l]->parameters());
      saved.emplace_back();
      for (const auto& p : params.back()) saved.back().push_back(p.detach().clone());
      hide(static_cast<int64_t>(l));
    }
  }
  void hide(int64_t l) {
    torch::NoGradGuard ng;
    for (auto& p : params[l]) p.data().fill_(std::numeric_limits<float>::quiet_NaN());
  }
  void show(int64_t l) {
    torch::NoGradGuard ng;
    for (std::size_t i = 0; i < params[l].size(); ++i) params[l][i].data().copy_(saved[l][i]);
  }
  void pre_forward(int64_t l) override {
    calls.push_back("F" + std::to_string(l));
    if (l >= 0) show(l);
  }
  void post_forward(int64_t l) override {
    calls.push_back("f" + std::to_string(l));
    hide(l);
  }
  void pre_backward(int64_t l) override {
    calls.push_back("B" + std::to_string(l));
    for (std::size_t k = 0; k < params.size(); ++k) hide(static_cast<int64_t>(k));
    show(l);
  }
};
}  // namespace

TEST(PolicyModelTest, ParamHooksBracketEveryUseOfALayersWeights) {
  for (int64_t recompute : {-2, -1, 1}) {  // -2: none; -1: every layer; 1: the first only
    const bool ckpt = recompute != -2;
    SCOPED_TRACE(!ckpt ? "no recomputation" : recompute < 0 ? "recomputation" : "first layer recomputed");
    auto l = load("llama");
    auto& m = l.p.model;
    m->train();
    m->set_gradient_checkpointing(ckpt);
    m->set_recompute_layers(ckpt ? recompute : -1);
    auto run = [&](std::vector<torch::Tensor>* grads) {
      m->zero_grad();
      const auto lp = m->token_logprobs(l.ids, l.mask);
      lp.sum().backward();
      for (const auto& p : m->parameters()) grads->push_back(p.grad().clone());
      return lp.detach();
    };
    std::vector<torch::Tensor> plain, hooked;
    const auto lp0 = run(&plain);
    HidingHooks hooks(*m);
    m->set_param_hooks(&hooks);
    const auto lp1 = run(&hooked);
    m->set_param_hooks(nullptr);
    EXPECT_TRUE(torch::equal(lp0, lp1));
    ASSERT_EQ(plain.size(), hooked.size());
    for (std::size_t i = 0; i < plain.size(); ++i) EXPECT_TRUE(torch::equal(plain[i], hooked[i])) << "parameter " << i;
    const int64_t L = static_cast<int64_t>(m->model->layers->size());
    std::vector<std::string> want = {"F-1"};
    for (int64_t k = 0; k < L; ++k) want.insert(want.end(), {"F" + std::to_string(k), "f" + std::to_string(k)});
    for (int64_t k = L - 1; k >= 0; --k) want.push_back("B" + std::to_string(k));
    EXPECT_EQ(hooks.calls, want);
  }
}

TEST(PolicyModelTest, CudaBf16ForwardRunsOnGpu) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  auto p = load_policy(t::refs_dir() + "/qwen2", torch::kCUDA);
  const std::string refs = t::refs_dir() + "/qwen2/refs.safetensors";
  torch::NoGradGuard g;
  const auto ours = p.model->forward(t::load_tensor(refs, "ids").cuda()).to(torch::kCPU, torch::kFloat32);
  // bf16 weights and activations: a loose bound, the fp32 CPU tests carry exactness.
  EXPECT_LT(t::max_abs_diff(ours, t::load_tensor(refs, "logits")), 0.15);
}

// Training on CUDA in bf16: the gradients of causal attention without a mask (flash
// attention reading the grouped K/V heads as they are) and with an all-ones padding mask
// (K/V expanded to every head, the memory-efficient kernel) both match the CPU's fp32
// gradients to bf16 precision, for a 2:1 (qwen2) and a 4:1 (llama) grouping.
TEST(PolicyModelTest, CudaBf16GradientsMatchTheCpuWithAndWithoutGroupedHeads) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  for (const std::string name : {"qwen2", "llama"}) {
    auto l = load(name);
    auto grads = [&](CausalLM& m, torch::Device dev, bool mask) {
      m->train();
      m->zero_grad();
      const auto ids = l.ids.to(dev);
      const auto am = mask ? torch::ones_like(ids) : torch::Tensor();
      m->token_logprobs(ids, am).sum().backward();
      std::map<std::string, torch::Tensor> g;
      for (const auto& p : m->named_parameters()) g[p.key()] = p.value().grad().to(torch::kCPU, torch::kFloat32);
      return g;
    };
    const auto ref = grads(l.p.model, torch::kCPU, false);
    auto gpu = load_policy(t::refs_dir() + "/" + name, torch::kCUDA);
    for (bool mask : {false, true}) {
      SCOPED_TRACE(name + (mask ? ": all-ones mask, expanded K/V" : ": no mask, grouped K/V"));
      const auto got = grads(gpu.model, torch::kCUDA, mask);
      ASSERT_EQ(got.size(), ref.size());
      for (const auto& [key, g] : ref) {
        const double size = g.abs().max().item<double>(), d = t::max_abs_diff(got.at(key), g);
        EXPECT_LE(d, 5e-2 * size + 1e-6) << key << ": max |difference| " << d << " of max " << size;
      }
    }
  }
}

// Negative control: the 1e-4 comparison is sensitive (a wrong RoPE theta must fail it).
TEST(PolicyModelTest, ComparisonDetectsWrongRopeTheta) {
  auto cfg = load_model_config(t::refs_dir() + "/qwen2/config.json");
  cfg.rope.theta = 10000.0;
  CausalLM m(cfg, torch::TensorOptions().dtype(torch::kFloat32));
  load_weights(m, t::refs_dir() + "/qwen2");
  const std::string refs = t::refs_dir() + "/qwen2/refs.safetensors";
  torch::NoGradGuard g;
  EXPECT_GT(t::max_abs_diff(m->forward(t::load_tensor(refs, "ids")), t::load_tensor(refs, "logits")), 1e-3);
}

// A libtorch error reaches a process's log line as its message only: c10::Error's what()
// carries a C++ backtrace ("Exception raised from ...", "frame #N: ...") that kf::message_of cuts.
TEST(PolicyModelTest, LibtorchErrorsReachTheLogWithoutTheirBacktrace) {
  try {
    (void)torch::zeros({2, 3}).view({4});
    FAIL() << "view of 6 elements as 4 did not throw";
  } catch (const std::exception& e) {
    const std::string full = e.what(), msg = kf::message_of(e);
    EXPECT_NE(msg.find("shape '[4]' is invalid for input of size 6"), std::string::npos) << msg;
    EXPECT_EQ(msg.find("frame #"), std::string::npos) << msg;
    EXPECT_EQ(msg.find("Exception raised from"), std::string::npos) << msg;
    EXPECT_LT(msg.size(), full.size()) << "nothing was cut: " << full;  // what() had the backtrace
  }
}
