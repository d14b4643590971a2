"""Linear recurrence via cumulative sums (a state-space style scan)."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.inp = nn.Linear(dim, dim)
        self.decay = nn.Parameter(torch.rand(dim) * 0.5 + 0.4)

    def forward(self, x):
        u = torch.tanh(self.inp(x))
        t = torch.arange(x.shape[1], device=x.device, dtype=x.dtype)
        logw = torch.log(self.decay)[None, None, :] * t[None, :, None]
        return torch.cumsum(u * torch.exp(-logw), dim=1) * torch.exp(logw)


# Size constants: the CUDA size (H200 estimate: 1.4e11 flop).
batch = 64
seq = 64
dim = 4096


def get_inputs():
    return [torch.randn(batch, seq, dim)]


def get_init_inputs():
    return [dim]


KF_SIZES = {"cpu": {"batch": 11, "seq": 64, "dim": 512}, "cuda": {"batch": 64, "seq": 64, "dim": 4096}}
KF_MODE = "eval"
KF_LEVEL = 3
KF_TAGS = ['model', 'reduction', 'elementwise']
