"""1 - cosine similarity per row, averaged."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, pred, target):
        return (1.0 - F.cosine_similarity(pred, target, dim=1)).mean()


# Size constants: the CUDA size (H200 estimate: 2 GiB read).
batch = 32768
dim = 8192


def get_inputs():
    # The target follows the prediction with a per-set weight c in [-1, 2]: the mean cosine
    # (~ c / sqrt(c^2 + 1)) moves between input sets by far more than the tolerance
    # (independent rows average to a constant within tolerance).
    c = torch.rand(()) * 3.0 - 1.0
    pred = torch.randn(batch, dim)
    return [pred, pred * c + torch.randn(batch, dim) + 0.3]


def get_init_inputs():
    return []


KF_SIZES = {"cpu": {"batch": 1835, "dim": 1024}, "cuda": {"batch": 32768, "dim": 8192}}
KF_MODE = "eval"
KF_LEVEL = 1
KF_TAGS = ['loss']
