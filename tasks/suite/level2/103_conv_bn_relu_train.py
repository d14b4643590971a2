"""Conv2d, BatchNorm in train mode, ReLU."""
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


# Size constants: the CUDA size (H200: measured 1.52 ms at half this size, so ~3.0 ms).
batch = 128
cin = 64
cout = 64
size = 128


def get_inputs():
    return [torch.randn(batch, cin, size, size)]


def get_init_inputs():
    return [cin, cout]


KF_SIZES = {"cpu": {"batch": 23, "cin": 16, "cout": 16, "size": 64}, "cuda": {"batch": 128, "cin": 64, "cout": 64, "size": 128}}
KF_MODE = "train"
KF_LEVEL = 2
KF_TAGS = ['conv', 'normalization', 'elementwise']
