"""Depthwise 3x3 convolution (groups = channels)."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self, cin, cout):
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, 3, padding=1, groups=cin)

    def forward(self, x):
        return self.conv(x)


# Size constants: the CUDA size (H200: measured 1.31 ms at half this size, so ~2.6 ms).
batch = 128
cin = 128
cout = 128
size = 128


def get_inputs():
    return [torch.randn(batch, cin, size, size)]


def get_init_inputs():
    return [cin, cout]


KF_SIZES = {"cpu": {"batch": 32, "cin": 32, "cout": 32, "size": 64}, "cuda": {"batch": 128, "cin": 128, "cout": 128, "size": 128}}
KF_MODE = "eval"
KF_LEVEL = 1
KF_TAGS = ['conv']
