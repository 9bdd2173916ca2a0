"""The torch.nn twins of fastlearn's models (same layers, same parameter names) and the Python side of
the safetensors round trip in tests/interop/safetensors_roundtrip_test.cpp.

    torch_twins.py DIR ARCH...

For each ARCH, in DIR/ARCH:
  - loads fastlearn's models/fastlearn.safetensors (safetensors.torch.load_file, load_state_dict strict) into the
    twin and compares its predictions on data.safetensors["x"] with data.safetensors["preds"] (fastlearn's);
  - makes a seeded twin with random weights and BatchNorm statistics and writes its state_dict to
    models/from_torch.safetensors and its predictions on x to torch_preds.safetensors.
Prints "<ARCH>: OK" or what differs; exits 1 if anything differs.

ARCH: simple_cnn (models::simple_cnn(3)) or resnet (models::resnet({.widths = {8, 16}, .classes = 3,
.stem_width = 8})) or conv_net (models::conv_net({.widths = {8, 16, 32}, .classes = 3})); keep them in step with fastlearn's models/models.cpp.
"""
import os
import sys

import torch
from safetensors.torch import load_file, save_file
from torch import nn

TOLERANCE = 1e-5  # times the largest logit when that is above 1


def simple_cnn(classes=3, in_channels=1):
    def conv(i, o):
        return nn.Conv2d(i, o, 3, stride=2, padding=1)
    return nn.Sequential(conv(in_channels, 32), nn.ReLU(), conv(32, 64), nn.ReLU(), conv(64, 64), nn.ReLU(),
                         nn.Flatten(), nn.Linear(64 * 4 * 4, classes))


class ConvBn(nn.Module):
    def __init__(self, i, o, kernel, stride, relu):
        super().__init__()
        self.conv = nn.Conv2d(i, o, kernel, stride=stride, padding=kernel // 2, bias=False)
        self.bn = nn.BatchNorm2d(o)
        self.relu = relu

    def forward(self, x):
        y = self.bn(self.conv(x))
        return torch.relu(y) if self.relu else y


class ResBlock(nn.Module):
    def __init__(self, i, o, stride):
        super().__init__()
        self.branch = nn.Sequential(ConvBn(i, o, 3, stride, True), ConvBn(o, o, 3, 1, False))
        shortcut = []
        if stride != 1:
            shortcut.append(nn.AvgPool2d(stride, ceil_mode=True))
        if i != o:
            shortcut.append(ConvBn(i, o, 1, 1, False))
        self.shortcut = nn.Sequential(*shortcut)

    def forward(self, x):
        identity = self.shortcut(x) if len(self.shortcut) else x
        return torch.relu(self.branch(x) + identity)


def resnet(widths=(8, 16), blocks_per_stage=1, classes=3, in_channels=1, stem_width=8):
    layers = [ConvBn(in_channels, stem_width, 3, 1, True), ConvBn(stem_width, stem_width, 3, 1, True)]
    channels = stem_width
    for stage, width in enumerate(widths):
        for b in range(blocks_per_stage):
            layers.append(ResBlock(channels, width, 2 if stage > 0 and b == 0 else 1))
            channels = width
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(channels, classes)]
    return nn.Sequential(*layers)


def conv_net(widths=(8, 16, 32), classes=3, in_channels=1, size=28):
    layers, channels = [], in_channels
    for width in widths:
        layers += [nn.Conv2d(channels, width, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(width), nn.ReLU()]
        channels, size = width, (size + 1) // 2
    return nn.Sequential(*layers, nn.Flatten(), nn.Linear(channels * size * size, classes))


ARCHS = {"simple_cnn": simple_cnn, "resnet": resnet, "conv_net": conv_net}


def check_fastlearn_weights(arch, folder):
    model = ARCHS[arch]()
    model.load_state_dict(load_file(os.path.join(folder, "models", "fastlearn.safetensors")), strict=True)
    model.eval()
    data = load_file(os.path.join(folder, "data.safetensors"))
    with torch.no_grad():
        preds = model(data["x"])
    want = data["preds"]
    if preds.shape != want.shape:
        return f"predictions have shape {tuple(preds.shape)}, fastlearn's {tuple(want.shape)}"
    diff = (preds - want).abs().max().item()
    # Relative: fastlearn's matrix products may run other MKL kernels than this process's (core/mkl_dispatch).
    bound = TOLERANCE * max(1.0, want.abs().max().item())
    return None if diff <= bound else f"predictions differ from fastlearn's by up to {diff} (bound {bound})"


def write_torch_weights(arch, folder):
    torch.manual_seed(7)
    model = ARCHS[arch]()
    with torch.no_grad():
        for name, t in model.state_dict().items():  # random weights and BatchNorm statistics
            if name.endswith("num_batches_tracked"):
                t.fill_(5)
            elif name.endswith("running_var"):
                t.uniform_(0.5, 2.0)
            else:
                t.normal_(0, 0.3)
    model.eval()
    with torch.no_grad():
        preds = model(load_file(os.path.join(folder, "data.safetensors"))["x"])
    os.makedirs(os.path.join(folder, "models"), exist_ok=True)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()},
              os.path.join(folder, "models", "from_torch.safetensors"))
    save_file({"preds": preds.contiguous()}, os.path.join(folder, "torch_preds.safetensors"))


def main():
    root, archs = sys.argv[1], sys.argv[2:]
    failed = False
    for arch in archs:
        folder = os.path.join(root, arch)
        problem = check_fastlearn_weights(arch, folder)
        write_torch_weights(arch, folder)
        print(f"{arch}: {problem or 'OK'}")
        failed = failed or problem is not None
    return 1 if failed else 0


if __name__ == "__main__":
    torch.set_num_threads(1)
    sys.exit(main())
