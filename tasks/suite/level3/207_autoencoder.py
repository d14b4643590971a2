"""Dense autoencoder with tanh bottleneck and MSE reconstruction loss."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self, dim, code):
        super().__init__()
        self.enc = nn.Sequential(nn.Linear(dim, dim // 2), nn.ReLU(), nn.Linear(dim // 2, code), nn.Tanh())
        self.dec = nn.Sequential(nn.Linear(code, dim // 2), nn.ReLU(), nn.Linear(dim // 2, dim))

    def forward(self, x):
        return F.mse_loss(self.dec(self.enc(x)), x)


# Size constants: the CUDA size (H200 estimate: 1.5e11 flop).
batch = 8192
dim = 4096
code = 256


def get_inputs():
    # A per-set scale: the reconstruction loss (~ s^2) moves between input sets by far more
    # than the tolerance.
    s = torch.rand(()) * 1.5 + 0.5
    return [torch.randn(batch, dim) * s]


def get_init_inputs():
    return [dim, code]


KF_SIZES = {"cpu": {"batch": 811, "dim": 512, "code": 64}, "cuda": {"batch": 8192, "dim": 4096, "code": 256}}
KF_MODE = "eval"
KF_LEVEL = 3
KF_TAGS = ['model', 'matmul']
