# Honest, torch ops only: tasks/deep_bn_mlp.py's Model (560 parameter and buffer tensors)
# with the same state_dict. Expected: ok (the sandbox protocol carries every tensor).
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, dim, depth):
        super().__init__()
        self.blocks = nn.ModuleList(
            [nn.Sequential(nn.Linear(dim, dim), nn.BatchNorm1d(dim), nn.ReLU()) for _ in range(depth)])

    def forward(self, x):
        for b in self.blocks:
            x = torch.add(x, b(x), alpha=0.05)
        return x
