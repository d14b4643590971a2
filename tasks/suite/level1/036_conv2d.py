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


# Size constants: the CUDA size (H200: measured 1.44 ms at half this size, so ~2.9 ms).
batch = 128
cin = 64
cout = 128
size = 128


def get_inputs():
    return [torch.randn(batch, cin, size, size)]


def get_init_inputs():
    return [cin, cout]


KF_SIZES = {"cpu": {"batch": 28, "cin": 16, "cout": 32, "size": 48}, "cuda": {"batch": 128, "cin": 64, "cout": 128, "size": 128}}
KF_MODE = "eval"
KF_LEVEL = 1
KF_TAGS = ['conv']
