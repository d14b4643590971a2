// The memory-lean layer functions (rms_norm, swiglu, rotary) against the plain expressions
// they replace: the same forward result, bitwise, and the same gradients to rounding, in
// fp32 and in the mixed dtypes bf16 autocast gives them (bf16 activations, fp32 weights or
// tables). Without grad mode they take the plain path (no autograd node).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "kf/policy/policy.h"
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

TEST(LeanLayersTest, SwigluMatchesThePlainExpression) {
  for (const auto& c : kCases) {
    SCOPED_TRACE(c10::toString(c.act));
    auto make = [&] { return std::vector<torch::Tensor>{leaf({5, 96}, c.act, 3, 3.0), leaf({5, 96}, c.act, 4)}; };
    const auto lean = run([](auto& in) { return swiglu(in[0], in[1]); }, make);
    const auto plain = run([](auto& in) { return torch::silu(in[0]) * in[1]; }, make);
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
  for (const auto& y : {rms_norm(x, w, 1e-6), swiglu(x, x)}) EXPECT_FALSE(y.requires_grad());
  EXPECT_TRUE(torch::equal(rms_norm(x, w, 1e-6), plain_rms_norm(x, w, 1e-6)));
}

}  // namespace
}  // namespace kf::policy
