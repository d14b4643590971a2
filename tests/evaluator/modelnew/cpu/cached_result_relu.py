# Cheat: computes once, then returns the saved tensor for every later call. Expected:
# rejected_cheat (a cached result / output that does not follow the inputs).
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.saved = None
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        if self.calls <= 2 or self.saved is None:  # the load-time warm-up and the first checked call
            self.saved = torch.relu(x)
        return self.saved
