"""Three conv-BN-ReLU stages, global pool, classifier."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self, classes):
        super().__init__()
        layers, cin = [], 3
        for cout in (32, 64, 128):
            layers += [nn.Conv2d(cin, cout, 3, padding=1), nn.BatchNorm2d(cout), nn.ReLU(), nn.MaxPool2d(2)]
            cin = cout
        self.features = nn.Sequential(*layers)
        self.head = nn.Linear(cin, classes)

    def forward(self, x):
        return self.head(self.features(x).mean(dim=(2, 3)))


# Size constants: the CUDA size (H200 estimate: 1e11 flop).
batch = 64
size = 224
classes = 1000


def get_inputs():
    # A per-set scale: the 2 x 10 logits at the CPU size (global means of the features) move
    # between input sets by far more than the tolerance.
    s = torch.rand(()) * 1.5 + 0.5
    return [torch.randn(batch, 3, size, size) * s]


def get_init_inputs():
    return [classes]


KF_SIZES = {"cpu": {"batch": 2, "size": 64, "classes": 10}, "cuda": {"batch": 64, "size": 224, "classes": 1000}}
KF_MODE = "eval"
KF_LEVEL = 3
KF_TAGS = ['model', 'conv', 'pooling']
