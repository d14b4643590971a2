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
    return [torch.randn(batch, dim), torch.randn(batch, dim), torch.randn(batch, dim)]


def get_init_inputs():
    return []


KF_SIZES = {"cpu": {"batch": 2963, "dim": 512}, "cuda": {"batch": 65536, "dim": 4096}}
KF_MODE = "eval"
KF_LEVEL = 2
KF_TAGS = ['loss']
