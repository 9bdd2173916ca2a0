"""Oracle for tests/oracles/mlp_sgd_oracle_test.cpp: trains the same MLP as fastlearn with plain PyTorch.

Reads initial weights and data from a safetensors file written by the C++ test, runs one epoch of
SGD (momentum 0.9) over the batches in order, and prints the loss of every batch as JSON.
usage: mlp_sgd_oracle.py INPUT.safetensors BATCH_SIZE LR
"""
import json
import sys

import torch
from safetensors.torch import load_file


def main() -> None:
    path, bs, lr = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
    tensors = load_file(path)
    x, y = tensors.pop("data/x"), tensors.pop("data/y")
    model = torch.nn.Sequential(
        torch.nn.Flatten(), torch.nn.Linear(x.shape[1], 16), torch.nn.ReLU(), torch.nn.Linear(16, 3)
    )
    model.load_state_dict(tensors, strict=True)
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    losses = []
    for start in range(0, x.shape[0], bs):
        loss = torch.nn.functional.cross_entropy(model(x[start:start + bs]), y[start:start + bs])
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    print(json.dumps(losses))


if __name__ == "__main__":
    torch.set_num_threads(1)
    main()
