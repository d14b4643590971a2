"""Two-layer MLP with GELU and residual."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self, dim, hidden):
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.up = nn.Linear(dim, hidden)
        self.down = nn.Linear(hidden, dim)

    def forward(self, x):
        return x + self.down(F.gelu(self.up(self.norm(x))))


# Size constants: the CUDA size (H200 estimate: 2.7e11 flop).
batch = 4096
dim = 2048
hidden = 8192


def get_inputs():
    return [torch.randn(batch, dim)]


def get_init_inputs():
    return [dim, hidden]


KF_SIZES = {"cpu": {"batch": 520, "dim": 256, "hidden": 1024}, "cuda": {"batch": 4096, "dim": 2048, "hidden": 8192}}
KF_MODE = "eval"
KF_LEVEL = 3
KF_TAGS = ['model', 'matmul']
