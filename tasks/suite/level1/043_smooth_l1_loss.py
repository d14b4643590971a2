"""Huber / smooth-L1 loss with beta 0.5 (both pieces used)."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, pred, target):
        return F.smooth_l1_loss(pred, target, beta=0.5)


# Size constants: the CUDA size (scaled x2 after measuring 1.00 ms on an H200).
batch = 65536
dim = 8192


def get_inputs():
    # A per-set scale: the loss must move between input sets by far more than the tolerance.
    s = torch.rand(()) * 1.5 + 0.5
    return [torch.randn(batch, dim) * s, torch.randn(batch, dim)]


def get_init_inputs():
    return []


KF_SIZES = {"cpu": {"batch": 7354, "dim": 1024}, "cuda": {"batch": 65536, "dim": 8192}}
KF_MODE = "eval"
KF_LEVEL = 1
KF_TAGS = ['loss']
