# Cheat: ReLU in place, into the input tensor, and returns it. Expected: rejected_cheat
# (modifies its inputs).
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return x.clamp_min_(0.0)
