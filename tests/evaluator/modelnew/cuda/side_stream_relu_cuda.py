# Cheat: the work goes to a side stream and forward returns without making the caller's
# stream wait for it (KernelBench's CUDA events on the current stream then time nothing).
# Expected: rejected_cheat, "unsynchronised side stream".
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.side = torch.cuda.Stream()

    def forward(self, x):
        with torch.cuda.stream(self.side):
            y = torch.relu(x)
        return y
