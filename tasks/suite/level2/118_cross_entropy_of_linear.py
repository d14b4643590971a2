"""Classifier head: linear then cross entropy."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self, in_features, classes):
        super().__init__()
        self.head = nn.Linear(in_features, classes)

    def forward(self, x, target):
        return F.cross_entropy(self.head(x), target)


# Size constants: the CUDA size (H200 estimate: 2.7e11 flop).
batch = 4096
in_features = 4096
classes = 8192


def get_inputs():
    # A per-set input scale in [1, 8]: the loss moves between input sets by far more than
    # the tolerance (unit inputs give logits of std 0.6, a loss near log(classes)).
    s = torch.rand(()) * 7.0 + 1.0
    return [torch.randn(batch, in_features) * s, torch.randint(0, classes, (batch,))]


def get_init_inputs():
    return [in_features, classes]


KF_SIZES = {"cpu": {"batch": 557, "in_features": 512, "classes": 1000}, "cuda": {"batch": 4096, "in_features": 4096, "classes": 8192}}
KF_MODE = "eval"
KF_LEVEL = 2
KF_TAGS = ['matmul', 'loss']
