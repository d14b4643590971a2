"""Mean over the outer and inner dimensions of a 3-D tensor (strided reduction to the middle one)."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return x.mean(dim=(0, 2))


# Size constants: the CUDA size (H200: 4 GiB read, the per-tensor cap; measured 1.62 ms).
batch = 256
rows = 64
dim = 65536


def get_inputs():
    # Per-set, per-row offsets: each mean moves between input sets by far more than the
    # tolerance (means of iid values sit within tolerance of 0.5 at the CUDA size).
    return [torch.randn(batch, rows, dim) * 3.0 + 0.5 + torch.randn(1, rows, 1)]


def get_init_inputs():
    return []


KF_SIZES = {"cpu": {"batch": 99, "rows": 64, "dim": 4096}, "cuda": {"batch": 256, "rows": 64, "dim": 65536}}
KF_MODE = "eval"
KF_LEVEL = 1
KF_TAGS = ['reduction']
