"""Matrix times vector (memory bound)."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, a, v):
        return torch.mv(a, v)


# Size constants: the CUDA size (H200: 4 GiB read, the per-tensor cap; measured 1.07 ms).
m = 32768
k = 32768


def get_inputs():
    return [torch.randn(m, k), torch.randn(k)]


def get_init_inputs():
    return []


KF_SIZES = {"cpu": {"m": 11833, "k": 2048}, "cuda": {"m": 32768, "k": 32768}}
KF_MODE = "eval"
KF_LEVEL = 1
KF_TAGS = ['matmul']
