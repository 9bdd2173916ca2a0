"""A Python model scripted with TorchScript, and its training in PyTorch, for tests/oracles/torchscript_test.cpp.

  torchscript_oracle.py DIR   writes into DIR:
    model.pt            torch.jit.script of a residual MLP with LayerNorm and two inputs, features (N, 8) float32 and
                        an index (N,) int64 into an embedding, seeded, untrained
    batches.safetensors x (320, 8), idx (320,), y (320, 1): 20 batches of 16, in order
    trained.safetensors the state dict after 20 steps of torch.optim.AdamW (lr 1e-3, betas (0.9, 0.999), eps 1e-8,
                        weight decay 0.01 decoupled) on the MSE, one step per batch, the LayerNorms' parameters and the
                        biases without weight decay (fastai's norm_bias_params rule, which fastlearn applies)
    int_arg.pt          a script whose forward takes an int beside its tensor (fastlearn refuses it)
    masked_mse.pt       a scripted loss over (pred, target, mask): the squared errors of the rows whose mask is 1
    trained_masked.safetensors  model.pt after the same 20 AdamW steps on masked_mse.pt, the mask (320, 1) of 0 and 1
                        stored in batches.safetensors as "mask"
    per_row_loss.pt     a scripted loss returning one value per row, not a scalar (fastlearn refuses it)
"""
import sys

import torch
from safetensors.torch import save_file
from torch import nn


class Block(nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.lin = nn.Linear(width, width)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return h + self.lin(torch.relu(self.norm(h)))


class ResMlp(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(10, 8)
        self.inp = nn.Linear(16, 32)
        self.blocks = nn.ModuleList([Block(32), Block(32)])
        self.out = nn.Linear(32, 1)

    def forward(self, x: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        h = self.inp(torch.cat([x, self.emb(idx)], 1))
        for block in self.blocks:
            h = block(h)
        return self.out(h)


class MaskedMSE(nn.Module):
    def forward(self, pred: torch.Tensor, target: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return ((pred - target) ** 2 * mask).sum() / mask.sum().clamp_min(1.0)


class PerRowLoss(nn.Module):
    def forward(self, pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return (pred - target) ** 2


class IntArg(nn.Module):
    def forward(self, x: torch.Tensor, n: int) -> torch.Tensor:
        return x * n


def main(out):
    torch.manual_seed(0)
    model = torch.jit.script(ResMlp())
    model.save(f"{out}/model.pt")
    torch.jit.script(IntArg()).save(f"{out}/int_arg.pt")
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(320, 8, generator=gen)
    idx = torch.randint(0, 10, (320,), generator=gen)
    y = x[:, :1] * 2 + idx[:, None].float() / 10 + 0.1 * torch.randn(320, 1, generator=gen)
    mask = (torch.rand(320, 1, generator=gen) < 0.7).float()
    save_file({"x": x, "idx": idx, "y": y, "mask": mask}, f"{out}/batches.safetensors")
    masked_mse = torch.jit.script(MaskedMSE())
    masked_mse.save(f"{out}/masked_mse.pt")
    torch.jit.script(PerRowLoss()).save(f"{out}/per_row_loss.pt")
    train(model, lambda p, s: nn.functional.mse_loss(p, y[s]), x, idx, f"{out}/trained.safetensors")
    train(torch.jit.load(f"{out}/model.pt"), lambda p, s: masked_mse(p, y[s], mask[s]), x, idx,
          f"{out}/trained_masked.safetensors")


def train(model, loss_of, x, idx, file):
    no_decay = [p for n, p in model.named_parameters() if ".norm." in n or n.endswith("bias")]
    decay = [p for n, p in model.named_parameters() if not (".norm." in n or n.endswith("bias"))]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=1e-3, betas=(0.9, 0.999), eps=1e-8)
    model.train()
    for b in range(20):
        s = slice(16 * b, 16 * (b + 1))
        loss = loss_of(model(x[s], idx[s]), s)
        opt.zero_grad()
        loss.backward()
        opt.step()
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, file)


if __name__ == "__main__":
    main(sys.argv[1])
