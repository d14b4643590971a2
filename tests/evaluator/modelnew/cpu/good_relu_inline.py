# Honest: ReLU as a C++ (OpenMP) kernel built with load_inline. Expected: ok, custom code ran.
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cpp_source = r"""
#include <torch/extension.h>
torch::Tensor relu_forward(torch::Tensor x) {
  auto xc = x.contiguous();
  auto y = torch::empty_like(xc);
  const float* in = xc.data_ptr<float>();
  float* out = y.data_ptr<float>();
  const int64_t n = xc.numel();
  #pragma omp parallel for
  for (int64_t i = 0; i < n; ++i) out[i] = in[i] > 0.f ? in[i] : 0.f;
  return y;
}
"""

relu_ext = load_inline(name="kf_test_relu_cpu", cpp_sources=cpp_source, functions=["relu_forward"],
                       extra_cflags=["-O3", "-fopenmp"], extra_ldflags=["-fopenmp"])


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.ext = relu_ext

    def forward(self, x):
        return self.ext.relu_forward(x)
