"""Conv2d, BatchNorm (eval), ReLU."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self, cin, cout):
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, 3, padding=1)
        self.bn = nn.BatchNorm2d(cout)

    def forward(self, x):
        return torch.relu(self.bn(self.conv(x)))


# Size constants: the CUDA size (H200 estimate: 6e10 flop + 1 GiB).
batch = 64
cin = 64
cout = 64
size = 128


def get_inputs():
    return [torch.randn(batch, cin, size, size)]


def get_init_inputs():
    return [cin, cout]


KF_SIZES = {"cpu": {"batch": 17, "cin": 16, "cout": 16, "size": 64}, "cuda": {"batch": 64, "cin": 64, "cout": 64, "size": 128}}
KF_MODE = "eval"
KF_LEVEL = 2
KF_TAGS = ['conv', 'normalization', 'elementwise']
