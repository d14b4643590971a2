"""Softmax over rows of bfloat16 logits."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return torch.softmax(x, dim=-1)


# Size constants: the CUDA size (H200: 4 GiB bf16 in + 4 GiB out; measured 3.67 ms).
batch = 65536
dim = 32768


def get_inputs():
    # A per-set logit scale in [4, 8]: rows are peaked, so many probabilities are far above
    # the bf16 tolerance and move between input sets (at scale 3 and the CUDA width almost
    # every probability is below the 1e-2 atol).
    s = torch.rand(()) * 4.0 + 4.0
    return [(torch.randn(batch, dim) * s).to(torch.bfloat16)]


def get_init_inputs():
    return []


KF_SIZES = {"cpu": {"batch": 6094, "dim": 2048}, "cuda": {"batch": 65536, "dim": 32768}}
KF_MODE = "eval"
KF_TOLERANCE = {"atol": 1e-2, "rtol": 2e-2}
KF_LEVEL = 1
KF_TAGS = ['normalization']
