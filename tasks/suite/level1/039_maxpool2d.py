"""Max pooling 3x3, stride 2."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self, cin, cout):
        super().__init__()
        self.conv = nn.MaxPool2d(3, stride=2, padding=1)

    def forward(self, x):
        return self.conv(x)


# Size constants: the CUDA size (scaled x2 after measuring 1.04 ms on an H200).
batch = 128
cin = 64
cout = 64
size = 256


def get_inputs():
    return [torch.randn(batch, cin, size, size)]


def get_init_inputs():
    return [cin, cout]


KF_SIZES = {"cpu": {"batch": 5, "cin": 16, "cout": 16, "size": 96}, "cuda": {"batch": 128, "cin": 64, "cout": 64, "size": 256}}
KF_MODE = "eval"
KF_LEVEL = 1
KF_TAGS = ['pooling']
