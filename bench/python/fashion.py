"""Shared by the Python anchors of bench/: Fashion-MNIST as tensors and the models of models/models.h.

The data is read from the same IDX files fastlearn reads and normalized the same way (scale to [0, 1],
then the mean and std of all training pixels). The anchors get float tensors already normalized, which
is the cheapest input a Python loop can have (fastlearn converts and normalizes uint8 batches on the fly).
The models are layer-for-layer the ones of models/models.cpp.
"""
import gzip
import pathlib

import numpy as np
import torch
from torch import nn


def read_idx(path: pathlib.Path) -> torch.Tensor:
    raw = path.read_bytes()
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    ndim = raw[3]
    dims = [int.from_bytes(raw[4 + 4 * i: 8 + 4 * i], "big") for i in range(ndim)]
    return torch.from_numpy(np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims).copy())


def find(folder: pathlib.Path, stem: str) -> pathlib.Path:
    for name in (stem, stem + ".gz"):
        if (folder / name).exists():
            return folder / name
    raise FileNotFoundError(f"{stem}(.gz) not found in {folder}")


def load(folder: str, train_items: int = 0, valid_items: int = 0):
    """(x_train, y_train, x_valid, y_valid): float (N, 1, 28, 28) normalized images, int64 labels."""
    d = pathlib.Path(folder)
    xt = read_idx(find(d, "train-images-idx3-ubyte")).unsqueeze(1).float().div_(255)
    yt = read_idx(find(d, "train-labels-idx1-ubyte")).long()
    xv = read_idx(find(d, "t10k-images-idx3-ubyte")).unsqueeze(1).float().div_(255)
    yv = read_idx(find(d, "t10k-labels-idx1-ubyte")).long()
    mean, std = xt.mean().item(), xt.std().item()
    xt, xv = (xt - mean) / std, (xv - mean) / std
    if train_items:
        xt, yt = xt[:train_items].contiguous(), yt[:train_items].contiguous()
    if valid_items:
        xv, yv = xv[:valid_items].contiguous(), yv[:valid_items].contiguous()
    return xt, yt, xv, yv


def simple_cnn(classes: int = 10) -> nn.Module:
    conv = lambda i, o: nn.Conv2d(i, o, 3, stride=2, padding=1)
    return nn.Sequential(conv(1, 32), nn.ReLU(), conv(32, 64), nn.ReLU(), conv(64, 64), nn.ReLU(),
                         nn.Flatten(), nn.Linear(64 * 4 * 4, classes))


def mlp(inputs: int, hidden: list, out: int) -> nn.Module:
    layers, width = [nn.Flatten()], inputs
    for h in hidden:
        layers += [nn.Linear(width, h), nn.ReLU()]
        width = h
    return nn.Sequential(*layers, nn.Linear(width, out))


class ConvBn(nn.Module):
    def __init__(self, cin, cout, kernel, stride, relu, zero_bn=False):
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, kernel, stride=stride, padding=kernel // 2, bias=False)
        self.bn = nn.BatchNorm2d(cout)
        if zero_bn:
            nn.init.zeros_(self.bn.weight)
        self.relu = relu

    def forward(self, x):
        y = self.bn(self.conv(x))
        return torch.relu(y) if self.relu else y


class ResBlock(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.branch = nn.Sequential(ConvBn(cin, cout, 3, stride, True), ConvBn(cout, cout, 3, 1, False, True))
        shortcut = []
        if stride != 1:
            shortcut.append(nn.AvgPool2d(stride, ceil_mode=True))
        if cin != cout:
            shortcut.append(ConvBn(cin, cout, 1, 1, False))
        self.shortcut = nn.Sequential(*shortcut)

    def forward(self, x):
        return torch.relu(self.branch(x) + self.shortcut(x))


def resnet(widths, blocks_per_stage=1, classes=10, in_channels=1, stem_width=32) -> nn.Module:
    layers = [ConvBn(in_channels, stem_width, 3, 1, True), ConvBn(stem_width, stem_width, 3, 1, True)]
    channels = stem_width
    for stage, width in enumerate(widths):
        for b in range(blocks_per_stage):
            layers.append(ResBlock(channels, width, 2 if stage > 0 and b == 0 else 1))
            channels = width
    return nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(channels, classes))


def conv_net(widths, classes=10, in_channels=1, size=28) -> nn.Module:
    layers, channels = [], in_channels
    for w in widths:
        layers += [nn.Conv2d(channels, w, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(w), nn.ReLU()]
        channels, size = w, (size + 1) // 2
    return nn.Sequential(*layers, nn.Flatten(), nn.Linear(channels * size * size, classes))


def model(name: str) -> nn.Module:
    """The models the benchmarks name: 'simple_cnn', 'mlp' (784-512-256-10), 'conv_net_W1_W2_...', 'resnet_W1_W2_..._sS'."""
    if name == "simple_cnn":
        return simple_cnn()
    if name == "mlp":
        return mlp(784, [512, 256], 10)
    if name.startswith("conv_net_"):
        return conv_net([int(p) for p in name.split("_")[2:]])
    if name.startswith("resnet_"):
        parts = name.split("_")[1:]
        stem = int(parts[-1][1:]) if parts[-1].startswith("s") else 32
        widths = [int(p) for p in parts if not p.startswith("s")]
        return resnet(widths, stem_width=stem)
    raise ValueError(f"unknown model '{name}' (simple_cnn, mlp, conv_net_<widths>, resnet_<widths>_s<stem>)")
