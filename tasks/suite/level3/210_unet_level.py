"""One U-Net level: down conv, up transposed conv, skip concat, fuse conv."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self, channels):
        super().__init__()
        self.down = nn.Conv2d(channels, channels * 2, 3, stride=2, padding=1)
        self.up = nn.ConvTranspose2d(channels * 2, channels, 2, stride=2)
        self.fuse = nn.Conv2d(channels * 2, channels, 3, padding=1)

    def forward(self, x):
        y = self.up(torch.relu(self.down(x)))
        return torch.relu(self.fuse(torch.cat([x, y], dim=1)))


# Size constants: the CUDA size (H200: measured 1.52 ms at half this size, so ~3.0 ms).
batch = 64
channels = 64
size = 128


def get_inputs():
    return [torch.randn(batch, channels, size, size)]


def get_init_inputs():
    return [channels]


KF_SIZES = {"cpu": {"batch": 5, "channels": 16, "size": 64}, "cuda": {"batch": 64, "channels": 64, "size": 128}}
KF_MODE = "eval"
KF_LEVEL = 3
KF_TAGS = ['model', 'conv']
