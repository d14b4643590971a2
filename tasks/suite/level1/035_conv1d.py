"""1-D convolution, kernel 5, padding 2."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self, cin, cout):
        super().__init__()
        self.conv = nn.Conv1d(cin, cout, 5, padding=2)

    def forward(self, x):
        return self.conv(x)


# Size constants: the CUDA size (H200: measured 1.64 ms at half this size, so ~3.3 ms).
batch = 128
cin = 128
cout = 128
length = 16384


def get_inputs():
    return [torch.randn(batch, cin, length)]


def get_init_inputs():
    return [cin, cout]


KF_SIZES = {"cpu": {"batch": 27, "cin": 32, "cout": 32, "length": 2048}, "cuda": {"batch": 128, "cin": 128, "cout": 128, "length": 16384}}
KF_MODE = "eval"
KF_LEVEL = 1
KF_TAGS = ['conv']
