"""Max values over the last dimension."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return torch.max(x, dim=1).values


# Size constants: the CUDA size (H200: 4 GiB read, the per-tensor cap; measured 1.53 ms).
batch = 65536
dim = 16384


def get_inputs():
    return [torch.randn(batch, dim) * 3.0 + 0.5]


def get_init_inputs():
    return []


KF_SIZES = {"cpu": {"batch": 3633, "dim": 2048}, "cuda": {"batch": 65536, "dim": 16384}}
KF_MODE = "eval"
KF_LEVEL = 1
KF_TAGS = ['reduction']
