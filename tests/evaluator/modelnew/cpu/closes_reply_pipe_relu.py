# Breaks the worker's own protocol: closes the reply pipe (fd 5) in forward, so the worker
# dies in its harness code, not in the candidate's. Expected: runtime_error whose reason
# carries the worker's cause (the OSError and where), not a bare "fatal: worker error".
import os

import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        try:
            os.close(5)
        except OSError:
            pass
        return torch.relu(x)
