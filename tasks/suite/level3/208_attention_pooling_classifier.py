"""Learned-query attention pooling, classifier and cross entropy."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self, dim, classes):
        super().__init__()
        self.query = nn.Parameter(torch.randn(1, 1, dim))
        self.key = nn.Linear(dim, dim)
        self.head = nn.Linear(dim, classes)

    def forward(self, x, target):
        k = self.key(x)
        w = torch.softmax(torch.matmul(self.query, k.transpose(1, 2)) / k.shape[-1] ** 0.5, dim=-1)
        pooled = torch.matmul(w, x).squeeze(1)
        return F.cross_entropy(self.head(pooled), target)


# Size constants: the CUDA size (H200 estimate: 7e10 flop).
batch = 256
seq = 1024
dim = 512
classes = 100


def get_inputs():
    # A per-set offset vector m (std 1-4) shared by every token: pooled ~ m, so the logits
    # (and the loss) differ between input sets by far more than the tolerance; zero-mean
    # tokens pool to ~0 and give a loss of ~log(classes) whatever the inputs.
    m = torch.randn(1, 1, dim) * (torch.rand(()) * 3.0 + 1.0)
    return [torch.randn(batch, seq, dim) + m, torch.randint(0, classes, (batch,))]


def get_init_inputs():
    return [dim, classes]


KF_SIZES = {"cpu": {"batch": 92, "seq": 128, "dim": 128, "classes": 10}, "cuda": {"batch": 256, "seq": 1024, "dim": 512, "classes": 100}}
KF_MODE = "eval"
KF_LEVEL = 3
KF_TAGS = ['model', 'attention', 'loss']
