"""Batched matrix product."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, a, b):
        return torch.bmm(a, b)


# Size constants: the CUDA size (H200 estimate: 1.4e11 flop).
batch = 64
m = 1024
k = 1024
n = 1024


def get_inputs():
    return [torch.randn(batch, m, k), torch.randn(batch, k, n)]


def get_init_inputs():
    return []


KF_SIZES = {"cpu": {"batch": 144, "m": 128, "k": 192, "n": 128}, "cuda": {"batch": 64, "m": 1024, "k": 1024, "n": 1024}}
KF_MODE = "eval"
KF_LEVEL = 1
KF_TAGS = ['matmul']
