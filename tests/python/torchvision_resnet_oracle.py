"""The torchvision side of tests/oracles/torchvision_resnet_test.cpp. Writes into OUT, for each of resnet18, 34, 50
(random weights, BatchNorm statistics and affine parameters drawn too, eval mode):
  <arch>.safetensors         its state dict, as safetensors.torch.save_file writes it
  <arch>_logits.safetensors  "logits": its output on the images below, read with Pillow, scaled to [0, 1]
                             and normalized with ImageNet's statistics (no resizing)
and the images themselves, image0.png and image1.png (3 x 64 x 80 random pixels).
usage: python torchvision_resnet_oracle.py OUT
"""
import sys

import numpy as np
import torch
import torchvision
from PIL import Image
from safetensors.torch import save_file


def main(out):
    rng = np.random.default_rng(0)
    images = []
    for i in range(2):
        pixels = rng.integers(0, 256, size=(64, 80, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(f"{out}/image{i}.png")
        images.append(np.asarray(Image.open(f"{out}/image{i}.png").convert("RGB")))
    x = torch.from_numpy(np.stack(images)).permute(0, 3, 1, 2).float() / 255
    mean = torch.tensor([0.485, 0.456, 0.406]).view(1, 3, 1, 1)
    std = torch.tensor([0.229, 0.224, 0.225]).view(1, 3, 1, 1)
    x = (x - mean) / std
    for arch in ("resnet18", "resnet34", "resnet50"):
        torch.manual_seed(0)
        model = getattr(torchvision.models, arch)(weights=None)
        with torch.no_grad():
            for m in model.modules():
                if isinstance(m, torch.nn.BatchNorm2d):
                    m.weight.uniform_(0.5, 1.5)
                    m.bias.uniform_(-0.2, 0.2)
                    m.running_mean.uniform_(-0.2, 0.2)
                    m.running_var.uniform_(0.5, 1.5)
        model.eval()
        with torch.no_grad():
            logits = model(x)
        save_file({k: v.contiguous() for k, v in model.state_dict().items()}, f"{out}/{arch}.safetensors")
        save_file({"logits": logits.contiguous()}, f"{out}/{arch}_logits.safetensors")
    print("ok")


if __name__ == "__main__":
    main(sys.argv[1])
