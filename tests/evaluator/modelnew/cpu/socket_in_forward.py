# Escape attempt: forward opens a network socket (to send the inputs out, or to fetch an
# answer). Expected: rejected_cheat, "sandbox violation: forbidden system call".
import socket

import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, x):
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.close()
        return torch.relu(x)
