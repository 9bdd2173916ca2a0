"""Anchor of bench/ddp_vs_torch.cpp: median step time of PyTorch DDP (Gloo) on simple_cnn or conv_net.

Run by torchrun on 2 ranks; each step: forward, cross entropy, backward (DDP averages the gradients),
SGD step, zero_grad, on a fixed random batch of BS 1x28x28 images per rank. Rank 0 prints the median.
LAYOUT: contiguous (default) or channels_last (the model and the batch in channels-last memory format).
MODEL: a name of fashion.py's model() (default simple_cnn); DDP's defaults, so BatchNorm buffers are
broadcast from rank 0 before each forward.
usage: torchrun --nproc-per-node 2 ddp_step.py BS STEPS [LAYOUT [MODEL]]
"""
import statistics
import sys
import time

import torch
import torch.distributed as dist

from fashion import model as fashion_model


def main() -> None:
    bs, steps = int(sys.argv[1]), int(sys.argv[2])
    channels_last = len(sys.argv) > 3 and sys.argv[3] == "channels_last"
    name = sys.argv[4] if len(sys.argv) > 4 else "simple_cnn"
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    net = fashion_model(name)
    if channels_last:
        net = net.to(memory_format=torch.channels_last)
    model = torch.nn.parallel.DistributedDataParallel(net)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x, y = torch.randn(bs, 1, 28, 28), torch.randint(0, 10, (bs,))
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    times = []
    for step in range(steps + 5):
        dist.barrier()
        start = time.perf_counter()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        opt.zero_grad()
        if step >= 5:
            times.append(time.perf_counter() - start)
    if dist.get_rank() == 0:
        print(f"{statistics.median(times):.6f} {min(times):.6f} {max(times):.6f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
