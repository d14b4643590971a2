"""softmax(x * scale + bias) over rows."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self, features):
        super().__init__()
        self.bias = nn.Parameter(torch.randn(features) * 0.5)

    def forward(self, x):
        return torch.softmax(x * 3.0 + self.bias, dim=-1)


# Size constants: the CUDA size (H200 estimate: 1 GiB in + out).
batch = 16384
features = 16384


def get_inputs():
    return [torch.randn(batch, features)]


def get_init_inputs():
    return [features]


KF_SIZES = {"cpu": {"batch": 2642, "features": 1024}, "cuda": {"batch": 16384, "features": 16384}}
KF_MODE = "eval"
KF_LEVEL = 2
KF_TAGS = ['normalization', 'elementwise']
