# Refused: ModelNew holds its weights under other names than the task's Model (fc.weight,
# fc.bias), so the task's parameters cannot be loaded into it. Expected: runtime_error naming
# the missing and unexpected names.
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, in_features, out_features):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(out_features, in_features))
        self.bias = nn.Parameter(torch.zeros(out_features))

    def forward(self, x):
        return x @ self.weight.t() + self.bias
