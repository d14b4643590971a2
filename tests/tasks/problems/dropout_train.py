# Dropout in train mode (nn.Module's default, and KernelBench's): random, so the importer needs
# an explicit choice (--mode eval) and refuses without one.
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, features, p):
        super().__init__()
        self.linear = nn.Linear(features, features)
        self.dropout = nn.Dropout(p)

    def forward(self, x):
        return torch.softmax(self.dropout(self.linear(x)), dim=1)


batch_size = 16
features = 32


def get_inputs():
    return [torch.randn(batch_size, features)]


def get_init_inputs():
    return [features, 0.2]
