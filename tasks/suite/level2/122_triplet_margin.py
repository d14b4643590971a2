"""Triplet margin loss written with torch ops."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, anchor, positive, negative):
        dp = (anchor - positive).pow(2).sum(dim=1).sqrt()
        dn = (anchor - negative).pow(2).sum(dim=1).sqrt()
        return torch.relu(dp - dn + 1.0).mean()


# Size constants: the CUDA size (H200: measured 1.53 ms at half this size, so ~3.1 ms).
batch = 65536
dim = 4096


def get_inputs():
    # A per-set scale of the negatives in [0.97, 1.03] moves dn against dp by up to
    # +-0.03 sqrt(2 dim): the loss moves between input sets by far more than the tolerance.
    s = torch.rand(()) * 0.06 + 0.97
    return [torch.randn(batch, dim), torch.randn(batch, dim), torch.randn(batch, dim) * s]


def get_init_inputs():
    return []


KF_SIZES = {"cpu": {"batch": 2963, "dim": 512}, "cuda": {"batch": 65536, "dim": 4096}}
KF_MODE = "eval"
KF_LEVEL = 2
KF_TAGS = ['loss']
