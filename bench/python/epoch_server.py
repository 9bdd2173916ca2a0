"""Python side of bench/vs_pytorch_loop.cpp and bench/vs_fastai.cpp: trains one epoch per request.

Started once by the C++ benchmark; prints "ready" after setup, then for every line "epoch" read on stdin
trains one epoch on the same Fashion-MNIST items, model, batch size, optimizer settings and thread count
as the C++ side, validates (loss and accuracy), and prints "<seconds> <valid accuracy>". Exits on EOF.
  --side torch : a plain PyTorch loop (what a user writes by hand; torch.optim.AdamW, shuffled batches by
                 indexing the tensors, validation loss and accuracy under no_grad).
  --side fastai: fastai's Learner.fit(1) (default callbacks, accuracy metric, no progress bar or logging)
                 on fastai DataLoaders over the same tensors.
usage: epoch_server.py --side torch|fastai --model NAME --data DIR --threads N --bs B --train-items N --valid-items N
                       [--channels-last]
"""
import argparse
import sys
import time

import torch
import torch.nn.functional as F

import fashion


def parse():
    p = argparse.ArgumentParser()
    p.add_argument("--side", choices=["torch", "fastai"], required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--data", required=True)
    p.add_argument("--threads", type=int, required=True)
    p.add_argument("--bs", type=int, required=True)
    p.add_argument("--train-items", type=int, required=True)
    p.add_argument("--valid-items", type=int, required=True)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--channels-last", action="store_true",
                   help="channels-last memory format (torch: model.to(memory_format); fastai: its ChannelsLast callback)")
    return p.parse_args()


def torch_epoch(model, opt, xt, yt, xv, yv, bs):
    """One epoch as a user writes it: shuffled full batches, forward, loss, backward, step, zero_grad,
    running loss; then validation loss and accuracy."""
    model.train()
    order = torch.randperm(len(xt))
    loss_sum, seen = 0.0, 0
    for i in range(0, len(xt) - bs + 1, bs):
        idx = order[i:i + bs]
        xb, yb = xt[idx], yt[idx]
        loss = F.cross_entropy(model(xb), yb)
        loss.backward()
        opt.step()
        opt.zero_grad()
        loss_sum += loss.item() * len(xb)
        seen += len(xb)
    model.eval()
    correct, valid_loss = 0, 0.0
    with torch.no_grad():
        for i in range(0, len(xv), 2 * bs):
            out = model(xv[i:i + 2 * bs])
            valid_loss += F.cross_entropy(out, yv[i:i + 2 * bs]).item() * len(out)
            correct += (out.argmax(1) == yv[i:i + 2 * bs]).sum().item()
    return correct / len(xv)


def main():
    a = parse()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    xt, yt, xv, yv = fashion.load(a.data, a.train_items, a.valid_items)
    model = fashion.model(a.model)
    if a.channels_last and a.side == "torch":
        model = model.to(memory_format=torch.channels_last)
    if a.side == "torch":
        # fastai's Adam defaults, which fastlearn's Adam shares: betas (0.9, 0.99), eps 1e-5, decoupled wd 0.01.
        opt = torch.optim.AdamW(model.parameters(), lr=a.lr, betas=(0.9, 0.99), eps=1e-5, weight_decay=0.01)
        run = lambda: torch_epoch(model, opt, xt, yt, xv, yv, a.bs)
    else:
        import fastai.callback.progress  # noqa: F401  (adds Learner.no_bar)
        from fastai.data.core import DataLoaders
        from fastai.data.load import DataLoader
        from fastai.learner import Learner
        from fastai.metrics import accuracy
        from fastai.optimizer import Adam
        from torch.utils.data import TensorDataset

        dls = DataLoaders(DataLoader(TensorDataset(xt, yt), bs=a.bs, shuffle=True, drop_last=True),
                          DataLoader(TensorDataset(xv, yv), bs=2 * a.bs))
        learn = Learner(dls, model, loss_func=F.cross_entropy, opt_func=Adam, metrics=accuracy)
        if a.channels_last:
            from fastai.callback.channelslast import ChannelsLast
            learn.add_cb(ChannelsLast())
        learn.logger = lambda *args, **kwargs: None

        def run():
            with learn.no_bar():
                learn.fit(1, a.lr)
            return float(learn.recorder.values[-1][-1])
    print("ready", flush=True)
    for line in sys.stdin:
        if line.strip() != "epoch":
            print(f"error: unknown request '{line.strip()}' (expected 'epoch')", flush=True)
            continue
        start = time.perf_counter()
        acc = run()
        print(f"{time.perf_counter() - start:.6f} {acc:.4f}", flush=True)


if __name__ == "__main__":
    main()
