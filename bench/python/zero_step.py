"""Anchor of bench/sharded_step.cpp: median step time of PyTorch DDP + ZeroRedundancyOptimizer (Gloo) and the bytes
each rank holds.

Run by torchrun on 2 ranks; each step: a barrier, forward, cross entropy, backward (DDP averages the gradients),
ZeroRedundancyOptimizer's step (each rank updates its share of the parameters with AdamW, fastai's defaults: betas
0.9/0.99, eps 1e-5, decoupled wd 0.01, lr 1e-3, then broadcasts them), zero_grad; a fixed random batch of BS items per
rank. MODEL: "mlp_8x1024" (8 layers of 1024 x 1024 and a head: 8.4M parameters, inputs of 1024) or a name of
fashion.py's model() (1x28x28 inputs). Rank 0 prints the median, min and max seconds per step, then the bytes of the
unique storages of the parameters, their gradients and the optimizer's state on rank 0 after the last backward.
usage: torchrun --nproc-per-node 2 zero_step.py BS STEPS MODEL
"""
import statistics
import sys
import time

import torch
import torch.distributed as dist
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch import nn

from fashion import model as fashion_model


def make_model(name: str) -> nn.Module:
    if name == "mlp_8x1024":
        layers = []
        for _ in range(8):
            layers += [nn.Linear(1024, 1024), nn.ReLU()]
        return nn.Sequential(*layers, nn.Linear(1024, 3))
    return fashion_model(name)


def held_bytes(model: nn.Module, opt: ZeroRedundancyOptimizer) -> int:
    seen, total = set(), 0
    tensors = [p for p in model.parameters()] + [p.grad for p in model.parameters() if p.grad is not None]
    for state in opt.optim.state.values():
        tensors += [t for t in state.values() if torch.is_tensor(t)]
    for t in tensors:
        storage = t.untyped_storage()
        if storage.data_ptr() not in seen:
            seen.add(storage.data_ptr())
            total += storage.nbytes()
    return total


def timed_steps(model: nn.Module, opt, name: str, bs: int, steps: int, held) -> None:
    """STEPS + 5 steps on a fixed random batch (the first 5 not timed), each from a barrier; rank 0 prints the median,
    min and max seconds per step, then held() as measured after the last backward."""
    shape = (bs, 1024) if name == "mlp_8x1024" else (bs, 1, 28, 28)
    x, y = torch.randn(*shape), torch.randint(0, 3, (bs,))
    times, held_after = [], 0
    for step in range(steps + 5):
        dist.barrier()
        start = time.perf_counter()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        if step == steps + 4:
            held_after = held()
        opt.step()
        opt.zero_grad()
        if step >= 5:
            times.append(time.perf_counter() - start)
    if dist.get_rank() == 0:
        print(f"{statistics.median(times):.6f} {min(times):.6f} {max(times):.6f} {held_after}", flush=True)


def main() -> None:
    bs, steps, name = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    net = make_model(name)
    model = torch.nn.parallel.DistributedDataParallel(net)
    opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.AdamW, lr=1e-3, betas=(0.9, 0.99),
                                  eps=1e-5, weight_decay=0.01)
    timed_steps(model, opt, name, bs, steps, lambda: held_bytes(net, opt))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
