# __init__ needs real tensor values (.item(), as KernelBench's Swin models do): the model
# cannot be built on the meta device, so the importer builds it on the CPU at its init sizes.
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, dim, depth, drop_rate):
        super().__init__()
        rates = [x.item() for x in torch.linspace(0, drop_rate, depth)]
        self.blocks = nn.ModuleList(nn.Linear(dim, dim) for _ in rates)
        self.gains = [1.0 - r for r in rates]

    def forward(self, x):
        for block, g in zip(self.blocks, self.gains):
            x = x + g * torch.tanh(block(x))
        return x


batch_size = 8
dim = 32
depth = 3


def get_inputs():
    return [torch.randn(batch_size, dim)]


def get_init_inputs():
    return [dim, depth, 0.2]
