"""SwiGLU feed-forward block (Llama style) with RMSNorm."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self, dim, hidden):
        super().__init__()
        self.scale = nn.Parameter(torch.randn(dim) * 0.1 + 1.0)
        self.gate = nn.Linear(dim, hidden, bias=False)
        self.up = nn.Linear(dim, hidden, bias=False)
        self.down = nn.Linear(hidden, dim, bias=False)

    def forward(self, x):
        h = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.scale
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


# Size constants: the CUDA size (H200 estimate: 2.8e11 flop).
batch = 4096
dim = 2048
hidden = 5632


def get_inputs():
    return [torch.randn(batch, dim)]


def get_init_inputs():
    return [dim, hidden]


KF_SIZES = {"cpu": {"batch": 429, "dim": 256, "hidden": 704}, "cuda": {"batch": 4096, "dim": 2048, "hidden": 5632}}
KF_MODE = "eval"
KF_LEVEL = 3
KF_TAGS = ['model', 'matmul', 'elementwise']
