# Honest: nn.Linear's parameters (same names as the task's Model), the matmul in a
# load_inline C++ function (torch::addmm). Expected: ok, custom code ran; the parameters are
# the task's (re-drawn ones too), not ModelNew's own init.
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cpp_source = r"""
#include <torch/extension.h>
torch::Tensor linear_forward(torch::Tensor x, torch::Tensor w, torch::Tensor b) {
  return torch::addmm(b, x, w.t());
}
"""

ext = load_inline(name="kf_test_linear_cpu", cpp_sources=cpp_source, functions=["linear_forward"])


class ModelNew(nn.Module):
    def __init__(self, in_features, out_features):
        super().__init__()
        self.fc = nn.Linear(in_features, out_features)

    def forward(self, x):
        return ext.linear_forward(x, self.fc.weight, self.fc.bias)
