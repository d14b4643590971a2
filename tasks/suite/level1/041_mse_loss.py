"""Mean squared error."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, pred, target):
        return F.mse_loss(pred, target)


# Size constants: the CUDA size (scaled x2 after measuring 1.00 ms on an H200).
batch = 65536
dim = 8192


def get_inputs():
    # A per-set scale: the loss (~ s^2 + 0.29) moves by far more than the tolerance between
    # input sets at any size; iid N(0, 1) alone gives its population value within
    # tolerance at the CUDA size, and a kernel returning that constant would pass.
    s = torch.rand(()) * 1.5 + 0.5
    return [torch.randn(batch, dim) * s, torch.randn(batch, dim) * 0.5 + 0.2]


def get_init_inputs():
    return []


KF_SIZES = {"cpu": {"batch": 4500, "dim": 1024}, "cuda": {"batch": 65536, "dim": 8192}}
KF_MODE = "eval"
KF_LEVEL = 1
KF_TAGS = ['loss']
