# Cheat: computes and returns float16 for a float32 task. Expected: rejected_cheat
# (precision downgrade, output dtype).
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return torch.relu(x.half())
