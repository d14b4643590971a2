"""Causal attention written with explicit matmul, mask and softmax."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, q, k, v):
        scale = q.shape[-1] ** -0.5
        scores = torch.matmul(q, k.transpose(-2, -1)) * scale
        seq = q.shape[-2]
        mask = torch.ones(seq, seq, dtype=torch.bool, device=q.device).tril()
        scores = scores.masked_fill(~mask, float("-inf"))
        return torch.matmul(torch.softmax(scores, dim=-1), v)


# Size constants: the CUDA size (H200 estimate: 1.1e11 flop + 2 GiB scores).
batch = 8
heads = 16
seq = 2048
dim = 64


def get_inputs():
    return [torch.randn(batch, heads, seq, dim), torch.randn(batch, heads, seq, dim), torch.randn(batch, heads, seq, dim)]


def get_init_inputs():
    return []


KF_SIZES = {"cpu": {"batch": 4, "heads": 4, "seq": 256, "dim": 64}, "cuda": {"batch": 8, "heads": 16, "seq": 2048, "dim": 64}}
KF_MODE = "eval"
KF_LEVEL = 1
KF_TAGS = ['attention']
