"""KL divergence between log-probabilities and probabilities."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, pred, target):
        return F.kl_div(torch.log_softmax(pred, dim=1), torch.softmax(target, dim=1), reduction='batchmean')


# Size constants: the CUDA size (H200 estimate: 1 GiB read, 3 passes).
batch = 16384
dim = 8192


def get_inputs():
    # A per-set target scale in [0.5, 4]: the divergence moves between input sets by far
    # more than the tolerance.
    s = torch.rand(()) * 3.5 + 0.5
    return [torch.randn(batch, dim) * 2.0, torch.randn(batch, dim) * s]


def get_init_inputs():
    return []


KF_SIZES = {"cpu": {"batch": 707, "dim": 1024}, "cuda": {"batch": 16384, "dim": 8192}}
KF_MODE = "eval"
KF_LEVEL = 1
KF_TAGS = ['loss']
