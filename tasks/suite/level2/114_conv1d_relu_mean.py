"""Conv1d, ReLU, mean over time."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self, cin, cout):
        super().__init__()
        self.conv = nn.Conv1d(cin, cout, 3, padding=1)

    def forward(self, x):
        return torch.relu(self.conv(x)).mean(dim=-1)


# Size constants: the CUDA size (H200 estimate: 1e11 flop).
batch = 64
cin = 128
cout = 128
length = 16384


def get_inputs():
    # A per-set scale: each mean moves between input sets by far more than the tolerance
    # (means over the CUDA length of unit inputs sit within ~50x of it).
    s = torch.rand(()) * 1.5 + 0.5
    return [torch.randn(batch, cin, length) * s]


def get_init_inputs():
    return [cin, cout]


KF_SIZES = {"cpu": {"batch": 25, "cin": 32, "cout": 32, "length": 2048}, "cuda": {"batch": 64, "cin": 128, "cout": 128, "length": 16384}}
KF_MODE = "eval"
KF_LEVEL = 2
KF_TAGS = ['conv', 'elementwise', 'reduction']
