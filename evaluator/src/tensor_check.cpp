#include "tensor_check.h"

#include <ATen/ATen.h>

#include <cmath>
#include <cstdio>

#include "../worker/poison.h"
#include "kf/common/error.h"
#include "kf/kernel.h"

namespace kf::evaluator {

int abi_dtype(c10::ScalarType t) {
  switch (t) {
    case at::kFloat: return KF_FLOAT32;
    case at::kHalf: return KF_FLOAT16;
    case at::kBFloat16: return KF_BFLOAT16;
    case at::kDouble: return KF_FLOAT64;
    case at::kInt: return KF_INT32;
    case at::kLong: return KF_INT64;
    case at::kShort: return KF_INT16;
    case at::kChar: return KF_INT8;
    case at::kByte: return KF_UINT8;
    case at::kBool: return KF_BOOL;
    default: throw Error(std::string("kernel ABI: unsupported dtype ") + c10::toString(t));
  }
}

c10::ScalarType aten_dtype(int d) {
  switch (d) {
    case KF_FLOAT32: return at::kFloat;
    case KF_FLOAT16: return at::kHalf;
    case KF_BFLOAT16: return at::kBFloat16;
    case KF_FLOAT64: return at::kDouble;
    case KF_INT32: return at::kInt;
    case KF_INT64: return at::kLong;
    case KF_INT16: return at::kShort;
    case KF_INT8: return at::kChar;
    case KF_UINT8: return at::kByte;
    case KF_BOOL: return at::kBool;
    default: throw Error("kernel ABI: bad dtype code " + std::to_string(d));
  }
}

namespace {
// Same-size integer view, for bit-level comparisons.
at::Tensor bits(const at::Tensor& t) {
  switch (t.element_size()) {
    case 8: return t.view(at::kLong);
    case 4: return t.view(at::kInt);
    case 2: return t.view(at::kShort);
    default: return t.view(at::kByte);
  }
}
int64_t poison_value(const at::Tensor& t, uint32_t pattern) {
  const uint64_t e = poison_element(abi_dtype(t.scalar_type()), pattern);
  switch (t.element_size()) {
    case 8: return int64_t(e);
    case 4: return int64_t(int32_t(uint32_t(e)));
    case 2: return int64_t(int16_t(uint16_t(e)));
    default: return int64_t(uint8_t(e));
  }
}
std::string fmt(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%.6g", v);
  return b;
}
}  // namespace

Compare compare_outputs(const at::Tensor& cand_in, const at::Tensor& ref_in, tasks::Tolerance tol, uint32_t poison) {
  Compare c;
  at::Tensor ref = ref_in.contiguous();
  at::Tensor cand = cand_in.to(ref.device()).contiguous();
  if (cand.sizes() != ref.sizes() || cand.scalar_type() != ref.scalar_type()) {
    c.ok = false;
    c.first_bad = "shape/dtype mismatch";
    return c;
  }
  c.total = ref.numel();
  if (c.total == 0) return c;
  // Fast path: bit-identical (one pass; exact kernels and the nondeterminism check).
  if (at::equal(bits(cand), bits(ref))) return c;
  auto describe = [&](const at::Tensor& good) {
    const int64_t i = good.logical_not().flatten().nonzero()[0][0].item<int64_t>();
    c.first_bad = "index " + std::to_string(i) + ": got " + fmt(cand.flatten()[i].item<double>()) + ", expected " +
                  fmt(ref.flatten()[i].item<double>());
    c.unwritten = bits(cand).eq(poison_value(cand, poison)).sum().item<int64_t>();
  };
  if (!at::isFloatingType(ref.scalar_type())) {
    at::Tensor good = cand.eq(ref);
    c.bad = c.total - good.sum().item<int64_t>();
    if (c.bad) {
      describe(good);
      c.max_abs = (cand.to(at::kDouble) - ref.to(at::kDouble)).abs().max().item<double>();
    }
    c.ok = c.bad == 0;
    return c;
  }
  const auto ct = ref.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  at::Tensor a = cand.to(ct), r = ref.to(ct);
  at::Tensor diff = (a - r).abs_();
  at::Tensor good = diff.le(r.abs().mul_(tol.rtol).add_(tol.atol));
  c.bad = c.total - good.sum().item<int64_t>();
  if (c.bad) {
    // Non-finite values must match exactly (NaN with NaN, +inf with +inf).
    good.logical_or_(a.eq(r)).logical_or_(a.isnan().logical_and_(r.isnan()));
    c.bad = c.total - good.sum().item<int64_t>();
    at::Tensor fin = a.isfinite().logical_and_(r.isfinite());
    diff.masked_fill_(fin.logical_not(), 0);
  }
  c.max_abs = diff.max().item<double>();
  const double scale = c.bad ? max_abs_value(ref) : r.abs().max().item<double>();
  c.max_rel = scale > 0 ? c.max_abs / scale : c.max_abs;
  if (c.bad) describe(good);
  c.ok = c.bad == 0;
  return c;
}

bool bitwise_equal(const at::Tensor& a, const at::Tensor& b) {
  if (a.sizes() != b.sizes() || a.scalar_type() != b.scalar_type()) return false;
  return at::equal(bits(a.contiguous()), bits(b.to(a.device()).contiguous()));
}

bool nearly_constant(const at::Tensor& t, double rel) {
  if (t.numel() <= 1) return true;
  if (!at::isFloatingType(t.scalar_type())) return t.min().item<double>() == t.max().item<double>();
  at::Tensor f = t.to(at::kDouble);
  f = at::where(f.isfinite(), f, at::zeros_like(f));
  const double mx = f.max().item<double>(), mn = f.min().item<double>();
  const double scale = std::max(std::abs(mx), std::abs(mn));
  return (mx - mn) <= rel * std::max(scale, 1e-30);
}

double max_abs_value(const at::Tensor& t) {
  if (t.numel() == 0) return 0;
  if (!at::isFloatingType(t.scalar_type())) return std::max(std::abs(t.max().item<double>()), std::abs(t.min().item<double>()));
  // One pass; non-finite values are ignored (they would dominate the scale).
  at::Tensor a = t.abs();
  if (!all_finite(t)) a = at::where(a.isfinite(), a, at::zeros_like(a));
  return a.max().item<double>();
}

bool all_finite(const at::Tensor& t) {
  if (!at::isFloatingType(t.scalar_type()) || t.numel() == 0) return true;
  // A sum is finite iff every term is (or it overflowed: then "not finite" is the safe answer).
  return std::isfinite(t.sum(at::kDouble).item<double>());
}

}  // namespace kf::evaluator
