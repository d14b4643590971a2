// Tensor comparisons of the verifier (torch side): dtype mapping to the kernel ABI,
// tolerance checks that also count unwritten (still poisoned) elements, bitwise equality.
#pragma once
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>

#include "kf/tasks/tasks.h"

namespace kf::evaluator {

int abi_dtype(c10::ScalarType t);  // throws kf::Error for unsupported dtypes
c10::ScalarType aten_dtype(int abi_dtype);

struct Compare {
  bool ok = true;
  int64_t bad = 0, total = 0;
  int64_t unwritten = 0;            // elements equal to the poison pattern
  double max_abs = 0, max_rel = 0;  // over elements where both are finite
  std::string first_bad;            // "index 17: got 0.5, expected 0.25"
};

// The float checks work through outputs in chunks of this many elements: whole-tensor
// temporaries (a double copy, |r|, masks) came to several times a 4 GiB output on a GPU
// that evaluators share. The results do not depend on the chunk size.
constexpr int64_t kCheckChunk = int64_t(1) << 26;

// `cand` and `ref` have the same shape and dtype (on any devices). For floats:
// |c - r| <= atol + rtol |r|, NaN matches NaN, inf matches the same inf. Integers and
// bool: exact. `poison` is the pattern the output was filled with before the call.
Compare compare_outputs(const at::Tensor& cand, const at::Tensor& ref, tasks::Tolerance tol, uint32_t poison,
                        int64_t chunk = kCheckChunk);

bool bitwise_equal(const at::Tensor& a, const at::Tensor& b);
// Output nearly constant: (max - min) <= rel * max|x| (or all equal for integers).
bool nearly_constant(const at::Tensor& t, double rel, int64_t chunk = kCheckChunk);
double max_abs_value(const at::Tensor& t, int64_t chunk = kCheckChunk);
bool all_finite(const at::Tensor& t);

}  // namespace kf::evaluator
