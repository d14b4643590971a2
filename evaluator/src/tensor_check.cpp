#include "tensor_check.h"

#include <ATen/ATen.h>

#include <cmath>
#include <limits>
#include <cstdio>

#include "wire/poison.h"
#include "kf/common/error.h"
#include "kf/kernel.h"

namespace kf::evaluator {

int abi_dtype(c10::ScalarType t) {
  switch (t) {
    case at::kFloat:
      return KF_FLOAT32;
    case at::kHalf:
      return KF_FLOAT16;
    case at::kBFloat16:
      return KF_BFLOAT16;
    case at::kDouble:
      return KF_FLOAT64;
    case at::kInt:
      return KF_INT32;
    case at::kLong:
      return KF_INT64;
    case at::kShort:
      return KF_INT16;
    case at::kChar:
      return KF_INT8;
    case at::kByte:
      return KF_UINT8;
    case at::kBool:
      return KF_BOOL;
    default:
      throw Error(std::string("kernel ABI: unsupported dtype ") + c10::toString(t));
  }
}

c10::ScalarType aten_dtype(int d) {
  switch (d) {
    case KF_FLOAT32:
      return at::kFloat;
    case KF_FLOAT16:
      return at::kHalf;
    case KF_BFLOAT16:
      return at::kBFloat16;
    case KF_FLOAT64:
      return at::kDouble;
    case KF_INT32:
      return at::kInt;
    case KF_INT64:
      return at::kLong;
    case KF_INT16:
      return at::kShort;
    case KF_INT8:
      return at::kChar;
    case KF_UINT8:
      return at::kByte;
    case KF_BOOL:
      return at::kBool;
    default:
      throw Error("kernel ABI: bad dtype code " + std::to_string(d));
  }
}

namespace {
// Same-size integer view, for bit-level comparisons.
at::Tensor bits(const at::Tensor& t) {
  switch (t.element_size()) {
    case 8:
      return t.view(at::kLong);
    case 4:
      return t.view(at::kInt);
    case 2:
      return t.view(at::kShort);
    default:
      return t.view(at::kByte);
  }
}
int64_t poison_value(const at::Tensor& t, uint32_t pattern) {
  const uint64_t e = poison_element(abi_dtype(t.scalar_type()), pattern);
  switch (t.element_size()) {
    case 8:
      return int64_t(e);
    case 4:
      return int64_t(int32_t(uint32_t(e)));
    case 2:
      return int64_t(int16_t(uint16_t(e)));
    default:
      return int64_t(uint8_t(e));
  }
}
std::string fmt(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%.6g", v);
  return b;
}
}  // namespace

// Calls f(offset, chunk) over a flat view of t, `chunk` elements at a time.
template <class F>
void for_chunks(const at::Tensor& flat, int64_t chunk, F f) {
  const int64_t n = flat.numel();
  for (int64_t s = 0; s < n; s += chunk) f(s, flat.slice(0, s, std::min(n, s + chunk)));
}

Compare compare_outputs(const at::Tensor& cand_in, const at::Tensor& ref_in, tasks::Tolerance tol, uint32_t poison,
                        int64_t chunk) {
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
  const at::Tensor cf = cand.reshape(-1), rf = ref.reshape(-1);
  auto describe = [&](int64_t i) {
    c.first_bad =
        "index " + std::to_string(i) + ": got " + fmt(cf[i].item<double>()) + ", expected " + fmt(rf[i].item<double>());
    const int64_t pv = poison_value(cand, poison);
    c.unwritten = 0;
    for_chunks(bits(cand).reshape(-1), chunk,
               [&](int64_t, const at::Tensor& bc) { c.unwritten += bc.eq(pv).sum().item<int64_t>(); });
  };
  if (!at::isFloatingType(ref.scalar_type())) {
    // Exact match, chunk by chunk like the float path: a whole-tensor mask and a double
    // copy of both sides came to 17 bytes an element on the failure path.
    int64_t first_bad = -1;
    for_chunks(cf, chunk, [&](int64_t at0, const at::Tensor& cc) {
      const at::Tensor r = rf.slice(0, at0, at0 + cc.numel());
      const at::Tensor bad = cc.ne(r);
      const int64_t n = bad.sum().item<int64_t>();
      if (!n) return;
      c.bad += n;
      if (first_bad < 0) first_bad = at0 + bad.nonzero()[0][0].item<int64_t>();
      c.max_abs = std::max(c.max_abs, (cc.to(at::kDouble) - r.to(at::kDouble)).abs().max().item<double>());
    });
    if (c.bad) describe(first_bad);
    c.ok = c.bad == 0;
    return c;
  }
  const auto ct = ref.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  // Per chunk: elements within tolerance; where some are not, equal values and NaN with
  // NaN count as good too, and the error maximum ignores non-finite pairs. Over the whole
  // tensor the maximum is the masked one only if some chunk had such elements.
  int64_t first_bad = -1, out_of_tol = 0;
  double max_masked = 0, max_unmasked = 0, ref_max = 0;
  for_chunks(cf, chunk, [&](int64_t at0, const at::Tensor& cc) {
    const at::Tensor a = cc.to(ct), r = rf.slice(0, at0, at0 + cc.numel()).to(ct);
    at::Tensor diff = (a - r).abs_();
    at::Tensor good = diff.le(r.abs().mul_(tol.rtol).add_(tol.atol));
    const int64_t n = a.numel(), off = n - good.sum().item<int64_t>();
    ref_max = std::max(ref_max, r.abs().max().item<double>());
    max_unmasked = std::max(max_unmasked, diff.max().item<double>());
    if (off) {
      out_of_tol += off;
      good.logical_or_(a.eq(r)).logical_or_(a.isnan().logical_and_(r.isnan()));
      const int64_t bad = n - good.sum().item<int64_t>();
      if (bad && first_bad < 0) first_bad = at0 + good.logical_not().nonzero()[0][0].item<int64_t>();
      c.bad += bad;
    }
    diff.masked_fill_(a.isfinite().logical_and_(r.isfinite()).logical_not_(), 0);
    max_masked = std::max(max_masked, diff.max().item<double>());
  });
  c.max_abs = out_of_tol ? max_masked : max_unmasked;
  const double scale = c.bad ? max_abs_value(ref, chunk) : ref_max;
  c.max_rel = scale > 0 ? c.max_abs / scale : c.max_abs;
  if (c.bad) describe(first_bad);
  c.ok = c.bad == 0;
  return c;
}

bool bitwise_equal(const at::Tensor& a, const at::Tensor& b) {
  if (a.sizes() != b.sizes() || a.scalar_type() != b.scalar_type()) return false;
  return at::equal(bits(a.contiguous()), bits(b.to(a.device()).contiguous()));
}

bool nearly_constant(const at::Tensor& t, double rel, int64_t chunk) {
  if (t.numel() <= 1) return true;
  if (!at::isFloatingType(t.scalar_type())) return t.min().item<double>() == t.max().item<double>();
  // Non-finite values count as 0 (they would dominate the range).
  double mx = -std::numeric_limits<double>::infinity(), mn = std::numeric_limits<double>::infinity();
  for_chunks(t.contiguous().reshape(-1), chunk, [&](int64_t, const at::Tensor& cc) {
    at::Tensor f = cc.to(at::kDouble);
    f.masked_fill_(f.isfinite().logical_not_(), 0);
    mx = std::max(mx, f.max().item<double>());
    mn = std::min(mn, f.min().item<double>());
  });
  const double scale = std::max(std::abs(mx), std::abs(mn));
  return (mx - mn) <= rel * std::max(scale, 1e-30);
}

double max_abs_value(const at::Tensor& t, int64_t chunk) {
  if (t.numel() == 0) return 0;
  if (!at::isFloatingType(t.scalar_type()))
    return std::max(std::abs(t.max().item<double>()), std::abs(t.min().item<double>()));
  // Non-finite values are ignored (they would dominate the scale).
  double mx = 0;
  for_chunks(t.contiguous().reshape(-1), chunk, [&](int64_t, const at::Tensor& cc) {
    at::Tensor a = cc.abs();
    a.masked_fill_(a.isfinite().logical_not_(), 0);
    mx = std::max(mx, a.max().item<double>());
  });
  return mx;
}

bool all_finite(const at::Tensor& t) {
  if (!at::isFloatingType(t.scalar_type()) || t.numel() == 0) return true;
  // A sum is finite iff every term is (or it overflowed: then "not finite" is the safe answer).
  return std::isfinite(t.sum(at::kDouble).item<double>());
}

}  // namespace kf::evaluator
