"""Half-precision linear layer with bias, then ReLU."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, in_features, out_features):
        super().__init__()
        self.fc = nn.Linear(in_features, out_features, dtype=torch.float16)

    def forward(self, x):
        return torch.relu(self.fc(x))


# Size constants: the CUDA size (H200: 2.2e12 flop fp16 on tensor cores; measured 3.00 ms).
batch = 16384
in_features = 8192
out_features = 8192


def get_inputs():
    return [torch.randn(batch, in_features).to(torch.float16)]


def get_init_inputs():
    return [in_features, out_features]


KF_SIZES = {"cpu": {"batch": 297, "in_features": 1024, "out_features": 1024}, "cuda": {"batch": 16384, "in_features": 8192, "out_features": 8192}}
KF_MODE = "eval"
KF_TOLERANCE = {"atol": 1e-2, "rtol": 1e-2}
KF_LEVEL = 2
KF_TAGS = ['matmul', 'elementwise']
