"""Cross entropy over classes with integer targets."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, pred, target):
        return F.cross_entropy(pred, target)


# Size constants: the CUDA size (H200: measured 1.30 ms at half this size, so ~2.6 ms).
batch = 65536
dim = 16384


def get_inputs():
    # A per-set logit scale in [1, 5]: the loss moves by units between input sets (with a
    # fixed scale it moves by less than 10x the tolerance at the CUDA size).
    s = torch.rand(()) * 4.0 + 1.0
    return [torch.randn(batch, dim) * s, torch.randint(0, dim, (batch,))]


def get_init_inputs():
    return []


KF_SIZES = {"cpu": {"batch": 6321, "dim": 1000}, "cuda": {"batch": 65536, "dim": 16384}}
KF_MODE = "eval"
KF_LEVEL = 1
KF_TAGS = ['loss']
