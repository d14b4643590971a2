# Imports a Python package that is not installed (as KernelBench's Mamba2 problems import einops).
import torch
import torch.nn as nn
import kf_package_that_is_not_installed  # noqa: F401


class Model(nn.Module):
    def forward(self, x):
        return x * 2


def get_inputs():
    return [torch.randn(8)]


def get_init_inputs():
    return []
