"""Small PyTorch models of the four families the front ends must take
(ResNet, VGG/AlexNet, Transformer encoder, LSTM classifier); shared by the
ONNX-export and torch.fx front-end tests. Import only where torch is."""

from __future__ import annotations

import torch
from torch import nn

B = 4


class Block(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.c1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.b1 = nn.BatchNorm2d(cout)
        self.c2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.b2 = nn.BatchNorm2d(cout)
        self.down = None if stride == 1 and cin == cout else nn.Sequential(
            nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        y = self.b2(self.c2(torch.relu(self.b1(self.c1(x)))))
        return torch.relu(y + (x if self.down is None else self.down(x)))


class ResNet(nn.Module):
    shape = (3, 16, 16)

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 8, 3, 1, 1, bias=False), nn.BatchNorm2d(8),
                                  nn.ReLU(), nn.MaxPool2d(2))
        self.layer1, self.layer2 = Block(8, 8, 1), Block(8, 16, 2)
        self.pool, self.fc = nn.AdaptiveAvgPool2d(1), nn.Linear(16, 10)

    def forward(self, x):
        return self.fc(torch.flatten(self.pool(self.layer2(self.layer1(self.stem(x)))), 1))


class AlexNet(nn.Module):
    shape = (3, 32, 32)

    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 8, 5, 2, 2), nn.ReLU(), nn.MaxPool2d(3, 2),
            nn.Conv2d(8, 12, 3, padding=1), nn.ReLU(), nn.MaxPool2d(3, 2))
        self.classifier = nn.Sequential(nn.Dropout(0.5), nn.Linear(12 * 3 * 3, 32), nn.ReLU(),
                                        nn.Dropout(0.5), nn.Linear(32, 5))

    def forward(self, x):
        return self.classifier(torch.flatten(self.features(x), 1))


class Encoder(nn.Module):
    seq, vocab = 6, 13

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(self.vocab, 16)
        self.pos = nn.Parameter(torch.randn(1, self.seq, 16) * 0.1)
        layer = nn.TransformerEncoderLayer(16, 4, 32, dropout=0.1, activation="gelu",
                                           batch_first=True)
        self.enc = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.fc = nn.Linear(16, 3)

    def forward(self, x):
        return self.fc(self.enc(self.emb(x) + self.pos)[:, 0])


class LSTMClassifier(nn.Module):
    seq, vocab = 5, 11

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(self.vocab, 6)
        self.lstm = nn.LSTM(6, 8, num_layers=2, batch_first=True)
        self.fc = nn.Linear(8, 3)

    def forward(self, x):
        out, (h, c) = self.lstm(self.emb(x))
        return self.fc(h[-1])


def example(cls, n: int = B, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    if hasattr(cls, "shape"):
        return torch.randn((n, *cls.shape), generator=g)
    return torch.randint(0, cls.vocab, (n, cls.seq), generator=g)


def build(cls, seed: int = 0):
    torch.manual_seed(seed)
    m = cls()
    for mod in m.modules():  # non-trivial running statistics
        if isinstance(mod, nn.BatchNorm2d):
            mod.running_mean.uniform_(-0.5, 0.5)
            mod.running_var.uniform_(0.5, 1.5)
    return m.eval()


FAMILIES = [ResNet, AlexNet, Encoder, LSTMClassifier]
