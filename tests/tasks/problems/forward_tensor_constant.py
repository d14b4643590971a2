# forward makes a tensor from a Python number and a plain tensor attribute holds state (as
# KernelBench's 93_ConvTranspose2d_Add_Min_GELU_Multiply and 33_VanillaRNN do): on meta
# their values are lost ("Cannot copy out of meta tensor"), so the model is built on the CPU.
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, features):
        super().__init__()
        self.linear = nn.Linear(features, features)
        self.offset = torch.randn(features)  # not a buffer: export lifts it as a constant

    def forward(self, x):
        y = self.linear(x) + self.offset
        return torch.min(y, torch.tensor(0.25, device=x.device))


batch_size = 16
features = 24


def get_inputs():
    return [torch.randn(batch_size, features)]


def get_init_inputs():
    return [features]
