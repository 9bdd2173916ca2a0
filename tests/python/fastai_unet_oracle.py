"""The fastai side of the U-Net oracle in tests/oracles/unet_test.cpp.

  python fastai_unet_oracle.py OUT          writes, for each case below, fastai's create_unet_model(arch, classes,
      size, pretrained=False, **options) in eval mode with random BatchNorm statistics:
      <case>.safetensors          its state dict, as safetensors.torch.save_file writes it
      inputs.safetensors          "<case>": (2, n_in, height, width) images
      logits.safetensors          "<case>": the model's output on them
      counts.txt                  "<case> <parameter count>" per line
  python fastai_unet_oracle.py OUT --check   loads fastlearn_<case>.safetensors (a fastlearn U-Net's weights under
      fastai's names) strictly into fresh fastai models and compares their output on the inputs with
      fastlearn_logits.safetensors; prints the largest difference of each, exits 1 above 1e-4 of the output's scale
      (its largest magnitude, at least 1).
"""
import sys

import torch
from fastai.vision.learner import create_unet_model
from safetensors.torch import load_file, save_file
from torchvision.models import resnet18, resnet34

# (arch, classes, size, options): non-square, sides not multiples of 32; "narrow" is 12 pixels wide, where fastai's
# U-Net drops the deepest skip; "options" sets every option fastlearn's UnetOptions mirrors.
CASES = {"resnet18": (resnet18, 3, (75, 54), {}), "resnet34": (resnet34, 3, (75, 54), {}),
         "narrow": (resnet18, 3, (40, 12), {}),
         "options": (resnet18, 2, (45, 70), dict(n_in=1, blur=True, blur_final=False, y_range=(-1.0, 3.0),
                                                 last_cross=False))}


def model(case):
    arch, classes, size, options = CASES[case]
    torch.manual_seed(0)
    m = create_unet_model(arch, classes, size, pretrained=False, **options)
    with torch.no_grad():
        for layer in m.modules():
            if isinstance(layer, torch.nn.BatchNorm2d):
                layer.weight.uniform_(0.5, 1.5)
                layer.bias.uniform_(-0.2, 0.2)
                layer.running_mean.uniform_(-0.2, 0.2)
                layer.running_var.uniform_(0.5, 1.5)
    return m.eval()


def main(out, check):
    if not check:
        g = torch.Generator().manual_seed(1)
        inputs = {case: torch.randn(2, CASES[case][3].get("n_in", 3), *CASES[case][2], generator=g) for case in CASES}
        save_file(inputs, f"{out}/inputs.safetensors")
        logits = {}
        with open(f"{out}/counts.txt", "w") as counts:
            for case in CASES:
                m = model(case)
                save_file({k: v.contiguous() for k, v in m.state_dict().items()}, f"{out}/{case}.safetensors")
                with torch.no_grad():
                    logits[case] = m(inputs[case]).contiguous()
                counts.write(f"{case} {sum(p.numel() for p in m.parameters())}\n")
        save_file(logits, f"{out}/logits.safetensors")
        return 0
    inputs = load_file(f"{out}/inputs.safetensors")
    expected = load_file(f"{out}/fastlearn_logits.safetensors")
    worst = 0.0
    for case in CASES:
        m = model(case)
        m.load_state_dict(load_file(f"{out}/fastlearn_{case}.safetensors"))  # strict
        with torch.no_grad():
            diff = (m(inputs[case]) - expected[case]).abs().max().item()
        diff /= max(1.0, expected[case].abs().max().item())
        print(f"{case}: largest difference {diff:.3g} of the output's scale")
        worst = max(worst, diff)
    return 0 if worst <= 1e-4 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], "--check" in sys.argv[2:]))
