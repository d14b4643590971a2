"""Transposed 2-D convolution, stride 2 (upsampling)."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self, cin, cout):
        super().__init__()
        self.conv = nn.ConvTranspose2d(cin, cout, 4, stride=2, padding=1)

    def forward(self, x):
        return self.conv(x)


# Size constants: the CUDA size (H200 estimate: 1.1e11 flop).
batch = 32
cin = 64
cout = 64
size = 128


def get_inputs():
    return [torch.randn(batch, cin, size, size)]


def get_init_inputs():
    return [cin, cout]


KF_SIZES = {"cpu": {"batch": 21, "cin": 16, "cout": 16, "size": 32}, "cuda": {"batch": 32, "cin": 64, "cout": 64, "size": 128}}
KF_MODE = "eval"
KF_LEVEL = 1
KF_TAGS = ['conv']
