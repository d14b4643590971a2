# Probe of the compile step's and worker's view: the module reads a host file when it is
# imported. Neither the confined compile step nor the worker can see /etc.
# Expected: compile_error, the diagnostics say the file does not exist.
import torch
import torch.nn as nn

SECRET = open("/etc/passwd").read()


class ModelNew(nn.Module):
    def forward(self, x):
        return torch.relu(x)
