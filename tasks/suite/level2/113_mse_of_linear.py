"""MSE loss of a linear prediction against targets."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self, in_features, out_features):
        super().__init__()
        self.fc = nn.Linear(in_features, out_features)

    def forward(self, x, target):
        return F.mse_loss(self.fc(x), target)


# Size constants: the CUDA size (H200 estimate: 1.4e11 flop).
batch = 4096
in_features = 4096
out_features = 4096


def get_inputs():
    # A per-set input scale: the loss (~ s^2 / 3 + 1) moves between input sets by far more
    # than the tolerance.
    s = torch.rand(()) * 1.5 + 0.5
    return [torch.randn(batch, in_features) * s, torch.randn(batch, out_features)]


def get_init_inputs():
    return [in_features, out_features]


KF_SIZES = {"cpu": {"batch": 1359, "in_features": 512, "out_features": 512}, "cuda": {"batch": 4096, "in_features": 4096, "out_features": 4096}}
KF_MODE = "eval"
KF_LEVEL = 2
KF_TAGS = ['matmul', 'loss']
