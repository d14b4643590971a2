"""GroupNorm then SiLU."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self, channels):
        super().__init__()
        self.norm = nn.GroupNorm(16, channels)

    def forward(self, x):
        return F.silu(self.norm(x))


# Size constants: the CUDA size (H200 estimate: 1 GiB in + out).
batch = 64
channels = 64
size = 256


def get_inputs():
    return [torch.randn(batch, channels, size, size) * 2.0]


def get_init_inputs():
    return [channels]


KF_SIZES = {"cpu": {"batch": 53, "channels": 32, "size": 48}, "cuda": {"batch": 64, "channels": 64, "size": 256}}
KF_MODE = "eval"
KF_LEVEL = 2
KF_TAGS = ['normalization', 'elementwise']
