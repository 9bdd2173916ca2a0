"""Anchor of bench/fsdp_vs_torch.cpp: median step time of PyTorch FSDP2 (fully_shard, Gloo on the CPU) and the bytes
each rank holds.

Run by torchrun on 2 ranks; the model as zero_step.py makes it, each top-level child with parameters (each Linear of
the MLP, each block of conv_net) given to fully_shard, then the root, with fully_shard's defaults (parameters
resharded after forward except the root's, fp32 everywhere). Each step: a barrier, forward, cross entropy, backward
(FSDP2 reduce-scatters each unit's gradients), AdamW's step (fastai's defaults: betas 0.9/0.99, eps 1e-5, decoupled
wd 0.01, lr 1e-3; foreach over the local shards), zero_grad; a fixed random batch of BS items per rank. Rank 0 prints
the median, min and max seconds per step, then the bytes of the unique local storages of the parameters, their
gradients and the optimizer's state on rank 0 after the last backward.
usage: torchrun --nproc-per-node 2 fsdp_step.py BS STEPS MODEL
"""
import sys

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor

from zero_step import make_model, timed_steps


def local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if isinstance(t, DTensor) else t


def held_bytes(model: torch.nn.Module, opt: torch.optim.Optimizer) -> int:
    seen, total = set(), 0
    tensors = [local(p) for p in model.parameters()] + [local(p.grad) for p in model.parameters() if p.grad is not None]
    for state in opt.state.values():
        tensors += [local(t) for t in state.values() if torch.is_tensor(t) and t.dim() > 0]
    for t in tensors:
        storage = t.untyped_storage()
        if storage.data_ptr() not in seen and storage.nbytes() > 0:
            seen.add(storage.data_ptr())
            total += storage.nbytes()
    return total


def main() -> None:
    bs, steps, name = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    net = make_model(name)
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    for child in net.children():
        if any(True for _ in child.parameters()):
            fully_shard(child, mesh=mesh)
    fully_shard(net, mesh=mesh)
    opt = torch.optim.AdamW(net.parameters(), lr=1e-3, betas=(0.9, 0.99), eps=1e-5, weight_decay=0.01)
    timed_steps(net, opt, name, bs, steps, lambda: held_bytes(net, opt))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
