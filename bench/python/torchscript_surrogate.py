"""The online_step surrogate as a user writes it in PyTorch, scripted for bench/torchscript_step.cpp.

  torchscript_surrogate.py OUT.pt WIDTH HIDDEN   torch.jit.script of the MLP WIDTH-HIDDEN-HIDDEN-WIDTH (ReLU), saved
"""
import sys

import torch
from torch import nn


def main(out, width, hidden):
    model = nn.Sequential(nn.Linear(width, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(),
                          nn.Linear(hidden, width))
    torch.jit.script(model).save(out)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
