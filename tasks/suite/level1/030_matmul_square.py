"""Square fp32 matrix product."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, a, b):
        return torch.matmul(a, b)


# Size constants: the CUDA size (H200 estimate: 1.4e11 flop fp32 ~ 3 ms).
n = 4096


def get_inputs():
    return [torch.randn(n, n), torch.randn(n, n)]


def get_init_inputs():
    return []


KF_SIZES = {"cpu": {"n": 720}, "cuda": {"n": 4096}}
KF_MODE = "eval"
KF_LEVEL = 1
KF_TAGS = ['matmul']
