"""Oracle for tests/oracles/ddp_oracle_test.cpp: PyTorch DistributedDataParallel's averaged gradients.

Run by torchrun on 2 ranks: reads the MLP's weights and every rank's batch from INPUT.safetensors, wraps
the model in DDP (Gloo), runs forward/backward on this rank's batch, and rank 0 writes the averaged
gradients (named like the parameters) to OUTPUT.safetensors.
usage: torchrun --nproc-per-node 2 ddp_grads_oracle.py INPUT OUTPUT
"""
import os
import sys

import torch
import torch.distributed as dist
from safetensors.torch import load_file, save_file


def main() -> None:
    source, target = sys.argv[1], sys.argv[2]
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    tensors = load_file(source)
    x, y = tensors.pop(f"data/x{rank}"), tensors.pop(f"data/y{rank}")
    for key in [k for k in tensors if k.startswith("data/")]:
        tensors.pop(key)
    model = torch.nn.Sequential(
        torch.nn.Flatten(), torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4)
    )
    model.load_state_dict(tensors, strict=True)
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    torch.nn.functional.cross_entropy(ddp(x), y).backward()
    if rank == 0:
        save_file({name: p.grad.contiguous() for name, p in model.named_parameters()}, target)
    dist.barrier()
    # Both ranks are done and the file is closed. PyTorch's Gloo teardown (destroy_process_group) sometimes aborts
    # a rank on a loaded machine ("terminate called without an active exception"), which would fail the oracle
    # after its work: leave without it.
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    torch.set_num_threads(1)
    main()
