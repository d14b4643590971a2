# Silent fallback: a custom kernel is built but forward never calls it (CUDA-L1's released
# kernels have this). Expected: ok (the output is right), flagged torch_only.
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cpp_source = r"""
#include <torch/extension.h>
torch::Tensor relu_forward(torch::Tensor x) { return x.clamp_min(0); }
"""

ext = load_inline(name="kf_test_fallback_cpu", cpp_sources=cpp_source, functions=["relu_forward"])


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        if x.dim() > 8:  # never true: the extension is "there" but never used
            return ext.relu_forward(x)
        return torch.relu(x)
