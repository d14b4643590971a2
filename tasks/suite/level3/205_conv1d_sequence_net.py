"""Stack of dilated 1-D convolutions with GELU (a WaveNet-like encoder)."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self, channels, layers):
        super().__init__()
        self.convs = nn.ModuleList(nn.Conv1d(channels, channels, 3, padding=2 ** i, dilation=2 ** i) for i in range(layers))

    def forward(self, x):
        for conv in self.convs:
            x = x + F.gelu(conv(x))
        return x


# Size constants: the CUDA size (H200 estimate: 1e11 flop).
batch = 32
channels = 128
length = 8192
layers = 4


def get_inputs():
    return [torch.randn(batch, channels, length)]


def get_init_inputs():
    return [channels, layers]


KF_SIZES = {"cpu": {"batch": 10, "channels": 32, "length": 1024, "layers": 4}, "cuda": {"batch": 32, "channels": 128, "length": 8192, "layers": 4}}
KF_MODE = "eval"
KF_LEVEL = 3
KF_TAGS = ['model', 'conv']
