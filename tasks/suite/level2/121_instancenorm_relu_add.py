"""InstanceNorm, ReLU, residual add."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self, channels):
        super().__init__()
        self.norm = nn.InstanceNorm2d(channels, affine=True)

    def forward(self, x):
        return torch.relu(self.norm(x)) + x


# Size constants: the CUDA size (H200 estimate: 1 GiB in + out).
batch = 64
channels = 64
size = 256


def get_inputs():
    return [torch.randn(batch, channels, size, size) * 2.0 + 0.5]


def get_init_inputs():
    return [channels]


KF_SIZES = {"cpu": {"batch": 30, "channels": 16, "size": 64}, "cuda": {"batch": 64, "channels": 64, "size": 256}}
KF_MODE = "eval"
KF_LEVEL = 2
KF_TAGS = ['normalization', 'elementwise']
