# Compact-parameter round trip: every kind of init KernelBench problems use, plus a tensor
# constant made in forward (stored in the params file, the rest by the init recipe).
import math

import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, features, hidden, vocab):
        super().__init__()
        self.linear = nn.Linear(features, hidden)
        self.conv = nn.Conv1d(1, 4, 3, padding=1)
        self.bn = nn.BatchNorm1d(4)
        self.lstm = nn.LSTM(hidden, hidden, num_layers=2, batch_first=True)
        self.attn = nn.MultiheadAttention(hidden, 4, batch_first=True)
        self.norm = nn.LayerNorm(hidden)
        self.embed = nn.Embedding(vocab, hidden)
        self.scale = nn.Parameter(torch.randn(hidden) * 0.02)
        self.pos = nn.Parameter(torch.zeros(1, 1, hidden))
        nn.init.trunc_normal_(self.pos, std=0.02)
        nn.init.orthogonal_(self.linear.weight)
        self.register_buffer("ramp", torch.arange(hidden, dtype=torch.float32) / hidden)

    def forward(self, x, tokens):
        h = self.linear(x)                                   # (B, T, hidden)
        c = self.bn(self.conv(h.mean(-1, keepdim=True).transpose(1, 2).reshape(-1, 1, h.shape[1])))
        h = h + c.mean(1).reshape(h.shape[0], h.shape[1], 1)
        h, _ = self.lstm(h + self.embed(tokens) + self.pos)
        a, _ = self.attn(h, h, h, need_weights=False)
        y = self.norm(a) * self.scale + self.ramp
        return torch.max(y, torch.tensor(-0.5, device=y.device)) * math.sqrt(2.0)


batch_size = 4
seq = 6
features = 12
hidden = 16
vocab = 10


def get_inputs():
    return [torch.randn(batch_size, seq, features), torch.randint(0, vocab, (batch_size, seq))]


def get_init_inputs():
    return [features, hidden, vocab]
