"""2-D convolution 3x3, stride 1, padding 1."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self, cin, cout):
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, 3, padding=1)

    def forward(self, x):
        return self.conv(x)


# Size constants: the CUDA size (H200 estimate: 1.2e11 flop).
batch = 64
cin = 64
cout = 128
size = 128


def get_inputs():
    return [torch.randn(batch, cin, size, size)]


def get_init_inputs():
    return [cin, cout]


KF_SIZES = {"cpu": {"batch": 18, "cin": 16, "cout": 32, "size": 48}, "cuda": {"batch": 64, "cin": 64, "cout": 128, "size": 128}}
KF_MODE = "eval"
KF_LEVEL = 1
KF_TAGS = ['conv']
