"""Python side of bench/online_step.cpp: the training step of a program that learns a surrogate while it runs,
driven from Python as such programs otherwise do it.

  online_step.py THREADS [WIDTH HIDDEN BATCH]
      prints "ready", then for each line "run N" on stdin takes N steps and prints "<seconds> <last loss>"

Each step: a batch of BATCH (default 256) samples of WIDTH (128) values (made beforehand, 16 of them in turn), the MLP
WIDTH-HIDDEN-HIDDEN-WIDTH (HIDDEN 512; ReLU), MSE loss, backward, torch.optim.Adam (fastai's defaults, as fastlearn's Adam: betas 0.9/0.99, eps 1e-5, lr
1e-3), zero_grad, and the loss read on the host (what a program logs or checks).
"""
import sys
import time

import torch
from torch import nn


def main():
    torch.set_num_threads(int(sys.argv[1]))
    width, hidden, batch = (int(a) for a in sys.argv[2:5]) if len(sys.argv) >= 5 else (128, 512, 256)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(width, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(),
                          nn.Linear(hidden, width))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3, betas=(0.9, 0.99), eps=1e-5)
    xs = [torch.randn(batch, width) for _ in range(16)]
    ys = [torch.tanh(x) for x in xs]
    print("ready", flush=True)
    for line in sys.stdin:
        parts = line.split()
        if len(parts) != 2 or parts[0] != "run":
            continue
        start = time.perf_counter()
        loss = None
        for i in range(int(parts[1])):
            out = model(xs[i % 16])
            loss = nn.functional.mse_loss(out, ys[i % 16])
            loss.backward()
            opt.step()
            opt.zero_grad()
            loss = loss.item()
        print(f"{time.perf_counter() - start} {loss}", flush=True)


if __name__ == "__main__":
    main()
