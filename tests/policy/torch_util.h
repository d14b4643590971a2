// Tensor helpers for the libtorch policy tests.
#pragma once
#include <torch/torch.h>

#include "kf/policy/policy.h"
#include "test_util.h"

namespace kf::policy::test {

// A tensor from a safetensors file, copied out of the mapping.
inline torch::Tensor load_tensor(const std::string& file, const std::string& name) {
  auto f = StFile::open(file);
  const auto* t = f->find(name);
  if (!t) throw std::runtime_error(file + ": no tensor " + name);
  return torch::from_blob(const_cast<void*>(f->data(*t)), t->shape,
                          torch::TensorOptions().dtype(dtype_from_name(t->dtype, file)))
      .clone();
}

inline double max_abs_diff(const torch::Tensor& a, const torch::Tensor& b) {
  return (a.to(torch::kFloat64) - b.to(torch::kFloat64)).abs().max().item<double>();
}

}  // namespace kf::policy::test
