"""Inclusive prefix sum along the last dimension."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return torch.cumsum(x, dim=1)


# Size constants: the CUDA size (H200: measured 1.16 ms at half this size, so ~2.3 ms).
batch = 32768
dim = 16384


def get_inputs():
    return [torch.randn(batch, dim)]


def get_init_inputs():
    return []


KF_SIZES = {"cpu": {"batch": 2594, "dim": 2048}, "cuda": {"batch": 32768, "dim": 16384}}
# fp32 prefix sums of 16384 standard-normal terms: a correct kernel that adds in another
# order than torch's scan differs by up to ~1.3e-3 (measured on the H200 over 2^29
# outputs), where the partial sums pass near zero, so the float32 default (1e-4) rejects
# every correct CUDA kernel. The error grows with the running sum, not with the output.
KF_TOLERANCE = {"atol": 5e-3, "rtol": 1e-4}
KF_MODE = "eval"
KF_LEVEL = 1
KF_TAGS = ['reduction']
