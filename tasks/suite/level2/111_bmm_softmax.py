"""Batched matmul followed by softmax."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, a, b):
        return torch.softmax(torch.bmm(a, b) * 0.125, dim=-1)


# Size constants: the CUDA size (H200 estimate: 7e10 flop + 0.5 GiB).
batch = 64
m = 1024
k = 512
n = 1024


def get_inputs():
    return [torch.randn(batch, m, k), torch.randn(batch, k, n)]


def get_init_inputs():
    return []


KF_SIZES = {"cpu": {"batch": 91, "m": 128, "k": 128, "n": 128}, "cuda": {"batch": 64, "m": 1024, "k": 512, "n": 1024}}
KF_MODE = "eval"
KF_LEVEL = 2
KF_TAGS = ['matmul', 'normalization']
