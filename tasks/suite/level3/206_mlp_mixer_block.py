"""MLP-Mixer block: token mixing then channel mixing."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self, tokens, dim):
        super().__init__()
        self.n1 = nn.LayerNorm(dim)
        self.tok1 = nn.Linear(tokens, tokens * 2)
        self.tok2 = nn.Linear(tokens * 2, tokens)
        self.n2 = nn.LayerNorm(dim)
        self.ch1 = nn.Linear(dim, dim * 4)
        self.ch2 = nn.Linear(dim * 4, dim)

    def forward(self, x):
        y = self.n1(x).transpose(1, 2)
        x = x + self.tok2(F.gelu(self.tok1(y))).transpose(1, 2)
        return x + self.ch2(F.gelu(self.ch1(self.n2(x))))


# Size constants: the CUDA size (H200 estimate: 1.4e11 flop).
batch = 64
tokens = 256
dim = 512


def get_inputs():
    return [torch.randn(batch, tokens, dim)]


def get_init_inputs():
    return [tokens, dim]


KF_SIZES = {"cpu": {"batch": 18, "tokens": 64, "dim": 128}, "cuda": {"batch": 64, "tokens": 256, "dim": 512}}
KF_MODE = "eval"
KF_LEVEL = 3
KF_TAGS = ['model', 'matmul', 'normalization']
