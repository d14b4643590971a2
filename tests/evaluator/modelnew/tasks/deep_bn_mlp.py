# A model of many small tensors, as KernelBench's level 3 networks have (ResNet18 about
# 120, DenseNet201 over 1,000): 80 blocks of Linear + BatchNorm1d + ReLU, 80 * 7 = 560
# parameter and buffer tensors. modelnew_test imports it and runs a ModelNew copy of it
# through the sandbox protocol (ModelNewTest.ModelWithHundredsOfTensorsFitsTheProtocol).
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, dim, depth):
        super().__init__()
        self.blocks = nn.ModuleList(
            [nn.Sequential(nn.Linear(dim, dim), nn.BatchNorm1d(dim), nn.ReLU()) for _ in range(depth)])

    def forward(self, x):
        for b in self.blocks:
            x = x + 0.05 * b(x)
        return x


batch_size = 256
dim = 64
depth = 80


def get_inputs():
    return [torch.randn(batch_size, dim)]


def get_init_inputs():
    return [dim, depth]


KF_SIZES = {"cpu": {"batch_size": 256, "dim": 64, "depth": 80}, "cuda": {"batch_size": 4096, "dim": 256, "depth": 80}}
KF_MODE = "eval"
KF_LEVEL = 3
KF_TOLERANCE = {"atol": 1e-3, "rtol": 1e-3}
