// The memory-lean layer functions (rms_norm, swiglu_down, rotary) against the plain expressions
// they replace: the same forward result, bitwise, and the same gradients to rounding, in
// fp32 and in the mixed dtypes bf16 autocast gives them (bf16 activations, fp32 weights or
// tables). Without grad mode they take the plain path (no autograd node). And their memory:
// one decoder layer keeps less for backward than the plain expressions would.
#include <gtest/gtest.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/impl/alloc_cpu.h>
#include <algorithm>
#include <cstdio>
#include <mutex>
#include <torch/torch.h>
#include <unordered_map>

#include <ATen/autocast_mode.h>

#include "../counting_allocator.h"  // defines: kf::test::CountingCpuAllocator
#include "kf/policy/policy.h"
#include "layers.h"
#include "torch_util.h"

namespace kf::policy {
namespace {
namespace t = kf::policy::test;

torch::Tensor plain_rms_norm(const torch::Tensor& x, const torch::Tensor& w, double eps) {
  const auto xf = x.to(torch::kFloat32);
  return w * (xf * torch::rsqrt(xf.pow(2).mean(-1, true) + eps)).to(x.scalar_type());
}

torch::Tensor plain_rotate_half(const torch::Tensor& x) {
  const int64_t h = x.size(-1) / 2;
  return torch::cat({-x.narrow(-1, h, h), x.narrow(-1, 0, h)}, -1);
}

torch::Tensor plain_rotary(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin) {
  return x * cos.unsqueeze(1) + plain_rotate_half(x) * sin.unsqueeze(1);
}

torch::Tensor leaf(torch::IntArrayRef shape, torch::ScalarType dt, int seed, double scale = 1.0) {
  torch::manual_seed(seed);
  return (torch::randn(shape) * scale).to(dt).requires_grad_(true);
}

// Runs f on fresh leaves made by `make`, backward with a fixed random output gradient;
// returns the output and each leaf's gradient (undefined where the leaf needs none).
template <class F, class Make>
std::vector<torch::Tensor> run(F f, Make make) {
  auto in = make();
  auto y = f(in);
  torch::manual_seed(99);
  const auto gy = torch::randn(y.sizes()).to(y.scalar_type());
  y.backward(gy);
  std::vector<torch::Tensor> out{y.detach()};
  for (auto& t : in) out.push_back(t.requires_grad() ? t.grad() : torch::Tensor());
  return out;
}

// Bitwise forward; gradients within tol of the plain ones, relative to their largest entry.
void expect_same(const std::vector<torch::Tensor>& lean, const std::vector<torch::Tensor>& plain, double tol) {
  ASSERT_EQ(lean.size(), plain.size());
  EXPECT_EQ(lean[0].scalar_type(), plain[0].scalar_type());
  EXPECT_TRUE(torch::equal(lean[0], plain[0])) << "forward differs by " << t::max_abs_diff(lean[0], plain[0]);
  for (std::size_t i = 1; i < lean.size(); ++i) {
    SCOPED_TRACE("gradient of input " + std::to_string(i - 1));
    ASSERT_EQ(lean[i].defined(), plain[i].defined());
    if (!plain[i].defined()) continue;
    EXPECT_EQ(lean[i].scalar_type(), plain[i].scalar_type());
    const double size = plain[i].abs().max().item<double>();
    ASSERT_GT(size, 0);
    EXPECT_LE(t::max_abs_diff(lean[i], plain[i]), tol * size);
  }
}

struct Dtypes {
  torch::ScalarType act, weight;
  double tol;
};
// fp32 throughout (CPU training); bf16 activations with fp32 weights (autocast over fp32
// weights); bf16 throughout (a bf16 base).
const Dtypes kCases[] = {{torch::kFloat32, torch::kFloat32, 1e-6},
                         {torch::kBFloat16, torch::kFloat32, 1e-2},
                         {torch::kBFloat16, torch::kBFloat16, 1e-2}};

TEST(LeanLayersTest, RmsNormMatchesThePlainExpression) {
  for (const auto& c : kCases) {
    SCOPED_TRACE(std::string(c10::toString(c.act)) + " x, " + c10::toString(c.weight) + " weight");
    auto make = [&] { return std::vector<torch::Tensor>{leaf({3, 7, 64}, c.act, 1), leaf({64}, c.weight, 2, 0.5)}; };
    const auto lean = run([](auto& in) { return rms_norm(in[0], in[1], 1e-6); }, make);
    const auto plain = run([](auto& in) { return plain_rms_norm(in[0], in[1], 1e-6); }, make);
    expect_same(lean, plain, c.tol);
  }
}

TEST(LeanLayersTest, RmsNormOfAFrozenWeightGivesOnlyTheInputGradient) {
  auto make = [] {
    auto w = leaf({32}, torch::kFloat32, 2);
    w.requires_grad_(false);
    return std::vector<torch::Tensor>{leaf({4, 32}, torch::kFloat32, 1), w};
  };
  const auto lean = run([](auto& in) { return rms_norm(in[0], in[1], 1e-5); }, make);
  const auto plain = run([](auto& in) { return plain_rms_norm(in[0], in[1], 1e-5); }, make);
  EXPECT_FALSE(lean[2].defined());
  expect_same(lean, plain, 1e-6);
}

// swiglu_down against down(silu(gate) * up): the output bitwise, and the gradients of gate,
// up and every trainable parameter of down (weight and bias when fine-tuned, the adapters
// with LoRA), in the settings the learner trains in.
struct DownCase {
  const char* name;
  torch::ScalarType act, weight;
  bool bias, lora, autocast;  // autocast: CPU bf16 autocast around forward (CUDA's stand-in)
  double tol;
};

struct CpuAutocastScope {
  explicit CpuAutocastScope(bool on) : on(on) {
    if (!on) return;
    at::autocast::set_autocast_enabled(at::kCPU, true);
    at::autocast::set_autocast_dtype(at::kCPU, at::kBFloat16);
    at::autocast::increment_nesting();
  }
  ~CpuAutocastScope() {
    if (!on) return;
    if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
    at::autocast::set_autocast_enabled(at::kCPU, false);
  }
  bool on;
};

std::vector<torch::Tensor> run_down(const DownCase& c, bool lean) {
  const int64_t in = 48, out = 24;
  torch::manual_seed(11);
  auto down = std::make_shared<LinearImpl>(in, out, c.bias, torch::TensorOptions().dtype(c.weight));
  {
    torch::NoGradGuard ng;
    down->weight.normal_(0, 0.1);
    if (c.bias) down->bias.normal_(0, 0.1);
  }
  if (c.lora) {
    auto gen = at::detail::createCPUGenerator(3);
    down->add_lora(4, 2.0, torch::TensorOptions().dtype(torch::kFloat32), gen);
    torch::NoGradGuard ng;
    down->lora_B->weight.normal_(0, 0.1);  // B = 0 would hide a wrong adapter gradient of A
  }
  auto gate = leaf({3, 5, in}, c.act, 12, 2.0), up = leaf({3, 5, in}, c.act, 13);
  torch::Tensor y;
  {
    CpuAutocastScope ac(c.autocast);
    y = lean ? swiglu_down(gate, up, *down) : down->forward(torch::silu(gate) * up);
  }
  torch::manual_seed(99);
  y.backward(torch::randn(y.sizes()).to(y.scalar_type()));
  std::vector<torch::Tensor> r{y.detach(), gate.grad(), up.grad()};
  for (const auto& p : down->parameters()) r.push_back(p.requires_grad() ? p.grad() : torch::Tensor());
  return r;
}

TEST(LeanLayersTest, SwigluDownMatchesThePlainExpression) {
  const DownCase cases[] = {
      {"fp32, fine-tuned weight and bias", torch::kFloat32, torch::kFloat32, true, false, false, 1e-6},
      {"fp32, frozen base with adapters", torch::kFloat32, torch::kFloat32, false, true, false, 1e-6},
      {"bf16 autocast over fp32 weights (fine-tuning)", torch::kBFloat16, torch::kFloat32, true, false, true, 1e-2},
      {"bf16 autocast, bf16 base, fp32 adapters (LoRA)", torch::kBFloat16, torch::kBFloat16, false, true, true, 1e-2}};
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    const auto lean = run_down(c, true), plain = run_down(c, false);
    ASSERT_EQ(lean.size(), plain.size());
    const auto trained = std::count_if(plain.begin() + 3, plain.end(), [](const auto& g) { return g.defined(); });
    EXPECT_EQ(trained, 2) << "weight and bias, or the two adapters";
    expect_same(lean, plain, c.tol);
  }
}

TEST(LeanLayersTest, RotaryMatchesThePlainExpression) {
  for (const auto& c : kCases) {
    SCOPED_TRACE(std::string(c10::toString(c.act)) + " x, " + c10::toString(c.weight) + " tables");
    auto make = [&] {
      auto cos = leaf({2, 6, 16}, c.weight, 5), sin = leaf({2, 6, 16}, c.weight, 6);
      cos.requires_grad_(false);
      sin.requires_grad_(false);
      return std::vector<torch::Tensor>{leaf({2, 3, 6, 16}, c.act, 7), cos, sin};
    };
    const auto lean = run([](auto& in) { return rotary(in[0], in[1], in[2]); }, make);
    const auto plain = run([](auto& in) { return plain_rotary(in[0], in[1], in[2]); }, make);
    expect_same(lean, plain, c.tol);
  }
}

// Negative control: the comparison sees a wrong gradient (a rotation the other way round).
TEST(LeanLayersTest, ComparisonDetectsAWrongRotation) {
  auto make = [] {
    auto cos = leaf({1, 4, 8}, torch::kFloat32, 5), sin = leaf({1, 4, 8}, torch::kFloat32, 6);
    cos.requires_grad_(false);
    sin.requires_grad_(false);
    return std::vector<torch::Tensor>{leaf({1, 2, 4, 8}, torch::kFloat32, 7), cos, sin};
  };
  const auto lean = run([](auto& in) { return rotary(in[0], in[1], in[2]); }, make);
  const auto wrong =
      run([](auto& in) { return in[0] * in[1].unsqueeze(1) - plain_rotate_half(in[0]) * in[2].unsqueeze(1); }, make);
  EXPECT_GT(t::max_abs_diff(lean[0], wrong[0]), 1e-3);
  EXPECT_GT(t::max_abs_diff(lean[1], wrong[1]), 1e-3);
}

TEST(LeanLayersTest, WithoutGradModeTheyRecordNothing) {
  auto x = leaf({2, 8}, torch::kFloat32, 1), w = leaf({8}, torch::kFloat32, 2);
  torch::NoGradGuard ng;
  for (const auto& y : {rms_norm(x, w, 1e-6), rotary(x.view({1, 1, 2, 8}), w.view({1, 1, 8}), w.view({1, 1, 8}))})
    EXPECT_FALSE(y.requires_grad());
  EXPECT_TRUE(torch::equal(rms_norm(x, w, 1e-6), plain_rms_norm(x, w, 1e-6)));
}

// ---- memory: one decoder layer keeps less for backward than the plain expressions ----

using kf::test::CountingCpuAllocator;

torch::Tensor plain_norm(const torch::Tensor& x, const RMSNorm& n) { return plain_rms_norm(x, n->weight, n->eps); }
torch::Tensor plain_proj(const torch::Tensor& x, LinearImpl& p) {
  auto y = torch::nn::functional::linear(x, p.weight, p.bias);
  const auto xa = x.to(p.lora_A->weight.scalar_type());  // the fp32 copy autocast casts back and keeps
  const auto d = torch::nn::functional::linear(torch::nn::functional::linear(xa, p.lora_A->weight), p.lora_B->weight);
  return y + (d * p.lora_scale).to(y.scalar_type());
}
torch::Tensor plain_layer(DecoderLayerImpl& l, const torch::Tensor& x, const RopeTables& r) {
  auto& a = *l.self_attn;
  const int64_t B = x.size(0), T = x.size(1), G = a.heads / a.kv_heads;
  const auto n1 = plain_norm(x, l.input_layernorm);
  auto q = plain_proj(n1, *a.q_proj).view({B, T, a.heads, a.head_dim}).transpose(1, 2);
  auto k = plain_proj(n1, *a.k_proj).view({B, T, a.kv_heads, a.head_dim}).transpose(1, 2);
  auto v = plain_proj(n1, *a.v_proj).view({B, T, a.kv_heads, a.head_dim}).transpose(1, 2);
  q = plain_rotary(q, r.cos, r.sin);
  k = plain_rotary(k, r.cos, r.sin).repeat_interleave(G, 1);
  v = v.repeat_interleave(G, 1);
  const auto o = at::scaled_dot_product_attention(q, k, v, {}, 0.0, true);
  const auto h = x + plain_proj(o.transpose(1, 2).reshape({B, T, a.heads * a.head_dim}), *a.o_proj);
  auto& m = *l.mlp;
  const auto n2 = plain_norm(h, l.post_attention_layernorm);
  return h + plain_proj(torch::silu(plain_proj(n2, *m.gate_proj)) * plain_proj(n2, *m.up_proj), *m.down_proj);
}

// One decoder layer of a bf16 base with fp32 adapters on all seven projections under (CPU)
// bf16 autocast, the 7 B LoRA setting, forward only: the bytes still allocated after it (the
// graph's saved tensors and the output) against a re-implementation with the plain
// expressions and the same weights. (Moved here from the learner's memory tests: what it
// measures is the policy's layers.)
TEST(LeanLayersTest, ALayerKeepsLessForBackwardThanThePlainExpressions) {
  auto& counter = CountingCpuAllocator::get();
  auto mc = named_model_shape("tiny");
  const int64_t T = 256, H = mc.hidden_size, I = mc.intermediate_size;
  CausalLM m(mc, torch::TensorOptions().dtype(torch::kBFloat16));
  m->init_random(5);
  LoraConfig lc;
  lc.rank = 4;
  lc.targets = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};
  m->enable_lora(lc, 2, torch::kFloat32);
  {
    torch::NoGradGuard ng;  // B = 0 would hide a wrong adapter path from the output check
    for (auto& p : m->named_parameters())
      if (p.key().find("lora_B") != std::string::npos) p.value().normal_(0, 0.02);
  }
  auto& layer = *m->model->layers[0]->as<DecoderLayerImpl>();
  const auto r = m->rope(torch::arange(T, torch::kInt64).unsqueeze(0));
  torch::manual_seed(3);
  // A later layer's input: the residual stream, which needs a gradient.
  const auto x = torch::randn({1, T, H}).to(torch::kBFloat16).requires_grad_(true);
  auto kept = [&](auto&& forward, torch::Tensor* out) {
    CpuAutocastScope on(true);
    return counter.kept_by([&] { *out = forward(); });
  };
  torch::Tensor y_lean, y_plain;
  const int64_t lean = kept([&] { return layer.forward(x, r, {}, nullptr, 0); }, &y_lean);
  const int64_t plain = kept([&] { return plain_layer(layer, x, r); }, &y_plain);
  ASSERT_TRUE(y_lean.requires_grad() && y_plain.requires_grad());
  EXPECT_TRUE(torch::equal(y_lean, y_plain)) << "the lean layer changed the forward result";
  // Per token, at least: each norm's fp32 copy of x less the bf16 x the lean norm keeps
  // (2 x 2H bytes), silu(gate) and the product down's adapter keeps (2 x 2I), q and its
  // rotated half (4H).
  const int64_t want = T * (8 * H + 4 * I);
  std::printf(
      "one layer's forward keeps %lld bytes per token (plain expressions: %lld; lower bound on the saving %lld)\n",
      static_cast<long long>(lean / T), static_cast<long long>(plain / T), static_cast<long long>(want / T));
  EXPECT_LE(lean + want, plain);
  // An adapted projection keeps no copy of its bf16 input: the frozen base keeps only its
  // weight, and the adapter the input itself, which the layer holds anyway.
  auto& up = *layer.mlp->up_proj;
  const auto n = torch::randn({1, T, H}).to(torch::kBFloat16).requires_grad_(true);
  y_lean = y_plain = torch::Tensor();  // the layer's graphs go before the counting starts
  torch::Tensor p_lean, p_plain;
  const int64_t lean_proj = kept([&] { return up.forward(n); }, &p_lean);
  const int64_t plain_proj_kept = kept([&] { return plain_proj(n, up); }, &p_plain);
  EXPECT_TRUE(torch::equal(p_lean, p_plain));
  std::printf("an adapted projection keeps %lld bytes per token (with the fp32 input copy: %lld)\n",
              static_cast<long long>(lean_proj / T), static_cast<long long>(plain_proj_kept / T));
  EXPECT_LE(lean_proj + T * H * 2, plain_proj_kept);
}

}  // namespace
}  // namespace kf::policy
