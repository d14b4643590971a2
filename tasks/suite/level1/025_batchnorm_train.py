"""BatchNorm2d in training mode (batch statistics, running stats updated)."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self, features):
        super().__init__()
        self.norm = nn.BatchNorm2d(features)

    def forward(self, x):
        return self.norm(x)


# Size constants: the CUDA size (H200 estimate: 1 GiB, two passes).
batch = 64
features = 64
size = 256


def get_inputs():
    return [torch.randn(batch, features, size, size) * 1.5 + 0.3]


def get_init_inputs():
    return [features]


KF_SIZES = {"cpu": {"batch": 48, "features": 16, "size": 64}, "cuda": {"batch": 64, "features": 64, "size": 256}}
KF_MODE = "train"
KF_LEVEL = 1
KF_TAGS = ['normalization']
