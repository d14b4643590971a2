"""Linear, swish, sum over features."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self, in_features, out_features):
        super().__init__()
        self.fc = nn.Linear(in_features, out_features)

    def forward(self, x):
        return F.silu(self.fc(x)).sum(dim=1)


# Size constants: the CUDA size (H200 estimate: 1.4e11 flop).
batch = 4096
in_features = 4096
out_features = 4096


def get_inputs():
    return [torch.randn(batch, in_features)]


def get_init_inputs():
    return [in_features, out_features]


KF_SIZES = {"cpu": {"batch": 1701, "in_features": 512, "out_features": 512}, "cuda": {"batch": 4096, "in_features": 4096, "out_features": 4096}}
KF_MODE = "eval"
KF_LEVEL = 2
KF_TAGS = ['matmul', 'elementwise', 'reduction']
