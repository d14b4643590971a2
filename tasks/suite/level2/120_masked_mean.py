"""Mean of x where a random mask is set, per row."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x, keep):
        m = (keep > 0.3).to(x.dtype)
        return (x * m).sum(dim=1) / m.sum(dim=1).clamp_min(1.0)


# Size constants: the CUDA size (H200 estimate: 2 GiB).
batch = 32768
dim = 8192


def get_inputs():
    return [torch.randn(batch, dim) + 1.0, torch.rand(batch, dim)]


def get_init_inputs():
    return []


KF_SIZES = {"cpu": {"batch": 1951, "dim": 1024}, "cuda": {"batch": 32768, "dim": 8192}}
KF_MODE = "eval"
KF_LEVEL = 2
KF_TAGS = ['reduction', 'elementwise']
