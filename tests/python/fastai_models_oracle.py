"""The fastai side of tests/oracles/fastai_models_test.cpp.

  python fastai_models_oracle.py OUT          writes, in eval mode with random weights and BatchNorm statistics:
      vision.safetensors / tabular.safetensors   the state dicts of fastai's create_vision_model(resnet18, 3) and
                                                 TabularModel([(4, 3), (5, 2)], 2, 3, [8, 4], ps=[0.1, 0.1],
                                                 embed_p=0.1), as safetensors.torch.save_file writes them
      inputs.safetensors                         "image" (2, 3, 64, 64), "x_cat" (5, 2) int64, "x_cont" (5, 2)
      logits.safetensors                         "vision" and "tabular": each model's output on those inputs
  python fastai_models_oracle.py OUT --check   loads fastlearn_vision.safetensors and fastlearn_tabular.safetensors
      (a fastlearn model's weights under fastai's names) into fresh fastai models and compares their output on the
      inputs with fastlearn_logits.safetensors; prints the largest difference of each, exits 1 above 1e-4.
"""
import sys

import torch
from fastai.tabular.model import TabularModel
from fastai.vision.learner import create_vision_model
from safetensors.torch import load_file, save_file
from torchvision.models import resnet18


def models():
    torch.manual_seed(0)
    vision = create_vision_model(resnet18, 3, pretrained=False)
    tabular = TabularModel([(4, 3), (5, 2)], 2, 3, [8, 4], ps=[0.1, 0.1], embed_p=0.1)
    for model in (vision, tabular):
        with torch.no_grad():
            for m in model.modules():
                if isinstance(m, (torch.nn.BatchNorm1d, torch.nn.BatchNorm2d)):
                    m.weight.uniform_(0.5, 1.5)
                    m.bias.uniform_(-0.2, 0.2)
                    m.running_mean.uniform_(-0.2, 0.2)
                    m.running_var.uniform_(0.5, 1.5)
        model.eval()
    return vision, tabular


def inputs():
    g = torch.Generator().manual_seed(1)
    return {"image": torch.randn(2, 3, 64, 64, generator=g), "x_cat": torch.stack(
        [torch.randint(0, 4, (5,), generator=g), torch.randint(0, 5, (5,), generator=g)], 1),
        "x_cont": torch.randn(5, 2, generator=g)}


def outputs(vision, tabular, x):
    with torch.no_grad():
        return {"vision": vision(x["image"]).contiguous(), "tabular": tabular(x["x_cat"], x["x_cont"]).contiguous()}


def main(out, check):
    vision, tabular = models()
    if not check:
        x = inputs()
        save_file(x, f"{out}/inputs.safetensors")
        save_file({k: v.contiguous() for k, v in vision.state_dict().items()}, f"{out}/vision.safetensors")
        save_file({k: v.contiguous() for k, v in tabular.state_dict().items()}, f"{out}/tabular.safetensors")
        save_file(outputs(vision, tabular, x), f"{out}/logits.safetensors")
        return 0
    vision.load_state_dict(load_file(f"{out}/fastlearn_vision.safetensors"))
    tabular.load_state_dict(load_file(f"{out}/fastlearn_tabular.safetensors"))
    got = outputs(vision, tabular, load_file(f"{out}/inputs.safetensors"))
    expected = load_file(f"{out}/fastlearn_logits.safetensors")
    worst = 0.0
    for name in ("vision", "tabular"):
        diff = (got[name] - expected[name]).abs().max().item()
        print(f"{name}: largest difference {diff:.3g}")
        worst = max(worst, diff)
    return 0 if worst <= 1e-4 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], "--check" in sys.argv[2:]))
