"""Scaled dot-product attention (non-causal)."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, q, k, v):
        return F.scaled_dot_product_attention(q, k, v)


# Size constants: the CUDA size (H200 estimate: 2.2e11 flop).
batch = 16
heads = 16
seq = 2048
dim = 64


def get_inputs():
    return [torch.randn(batch, heads, seq, dim), torch.randn(batch, heads, seq, dim), torch.randn(batch, heads, seq, dim)]


def get_init_inputs():
    return []


KF_SIZES = {"cpu": {"batch": 9, "heads": 4, "seq": 256, "dim": 64}, "cuda": {"batch": 16, "heads": 16, "seq": 2048, "dim": 64}}
KF_MODE = "eval"
KF_LEVEL = 1
KF_TAGS = ['attention']
