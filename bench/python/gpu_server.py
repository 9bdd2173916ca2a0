"""Python side of bench/gpu.cpp (the GPU benchmarks): trains on the GPU, one epoch per request.

Started once per comparison by the C++ benchmark; prints "ready" after setup, then for every line "epoch"
read on stdin trains one epoch and prints "<seconds> <items> <valid accuracy>"; for "tta" it trains
fit_one_cycle(epochs, lr) from fresh weights and prints "<seconds to the target accuracy or -1> <best accuracy>";
for "trace PATH" it trains one epoch under torch.profiler, saves a Chrome trace to PATH and prints "traced".
Exits on EOF. Both sides train in bf16 autocast and channels-last memory format.
  --side torch : a plain PyTorch loop (what a user writes by hand: data on the GPU, torch.autocast(bf16),
                 model and inputs in channels_last, torch.optim.AdamW with fastai's Adam settings).
  --side fastai: fastai's Learner (to_bf16(), to_channelslast(), fastai's Adam) on fastai DataLoaders over
                 the same GPU tensors.
  --data fashion:DIR   Fashion-MNIST (normalized like fastlearn)   --data synthetic:N   N random 3x224x224 images
usage: gpu_server.py --side torch|fastai --model NAME --data SPEC --bs B [--lr X] [--epochs E --target A]
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
    p.add_argument("--bs", type=int, required=True)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--epochs", type=int, default=6)
    p.add_argument("--target", type=float, default=0.92)
    return p.parse_args()


def load(spec: str, device):
    kind, _, arg = spec.partition(":")
    if kind == "fashion":
        xt, yt, xv, yv = fashion.load(arg)
    elif kind == "synthetic":
        n = int(arg)
        g = torch.Generator().manual_seed(0)
        yt = torch.randint(0, 10, (n,), generator=g)
        xt = torch.randn(n, 3, 224, 224, generator=g) + yt.view(-1, 1, 1, 1) * 0.05
        xv, yv = xt[: n // 8].clone(), yt[: n // 8].clone()
    else:
        raise ValueError(f"unknown data '{spec}' (fashion:DIR or synthetic:N)")
    return [t.to(device) for t in (xt, yt, xv, yv)]


def build_model(name: str, channels: int):
    if name.startswith("resnet_") and channels == 3:
        parts = name.split("_")[1:]
        stem = int(parts[-1][1:]) if parts[-1].startswith("s") else 32
        return fashion.resnet([int(p) for p in parts if not p.startswith("s")], in_channels=3, stem_width=stem)
    return fashion.model(name)


def main():
    a = parse()
    device = torch.device("cuda")
    torch.manual_seed(0)
    xt, yt, xv, yv = load(a.data, device)
    fresh = lambda: build_model(a.model, xt.shape[1]).to(device).to(memory_format=torch.channels_last)

    if a.side == "torch":
        state = {}

        def reset():
            state["model"] = fresh()
            state["opt"] = torch.optim.AdamW(state["model"].parameters(), lr=a.lr, betas=(0.9, 0.99), eps=1e-5,
                                             weight_decay=0.01)

        def validate(model):
            model.eval()
            correct = torch.zeros((), device=device)
            with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
                for i in range(0, len(xv), 2 * a.bs):
                    out = model(xv[i:i + 2 * a.bs].contiguous(memory_format=torch.channels_last))
                    correct += (out.argmax(1) == yv[i:i + 2 * a.bs]).sum()
            return correct.item() / len(xv)

        def train_epoch(sched=None):
            """Shuffled full batches: forward under autocast, loss, backward, step, zero_grad."""
            model, opt = state["model"], state["opt"]
            model.train()
            order = torch.randperm(len(xt), device=device)
            seen = 0
            for i in range(0, len(xt) - a.bs + 1, a.bs):
                idx = order[i:i + a.bs]
                with torch.autocast("cuda", dtype=torch.bfloat16):
                    loss = F.cross_entropy(model(xt[idx].contiguous(memory_format=torch.channels_last)), yt[idx])
                loss.backward()
                opt.step()
                opt.zero_grad()
                if sched:
                    sched.step()
                seen += len(idx)
            return seen

        reset()

        def run_epoch():
            seen = train_epoch()
            return seen, validate(state["model"])

        def run_tta():
            reset()
            sched = torch.optim.lr_scheduler.OneCycleLR(state["opt"], max_lr=a.lr,
                                                        total_steps=a.epochs * (len(xt) // a.bs), pct_start=0.25,
                                                        div_factor=25, final_div_factor=1e5)
            start, reached, best = time.perf_counter(), -1.0, 0.0
            for _ in range(a.epochs):
                train_epoch(sched)
                acc = validate(state["model"])
                best = max(best, acc)
                if acc >= a.target:
                    reached = time.perf_counter() - start
                    break
            return reached, best
    else:
        import fastai.callback.progress  # noqa: F401  (adds Learner.no_bar)
        from fastai.callback.fp16 import MixedPrecision  # noqa: F401  (adds Learner.to_bf16)
        from fastai.callback.channelslast import ChannelsLast  # noqa: F401  (adds Learner.to_channelslast)
        from fastai.callback.schedule import fit_one_cycle  # noqa: F401
        from fastai.data.core import DataLoaders
        from fastai.data.load import DataLoader
        from fastai.learner import Learner
        from fastai.metrics import accuracy
        from fastai.optimizer import Adam
        from torch.utils.data import TensorDataset

        def make_learner():
            dls = DataLoaders(DataLoader(TensorDataset(xt, yt), bs=a.bs, shuffle=True, drop_last=True, device=device),
                              DataLoader(TensorDataset(xv, yv), bs=2 * a.bs, device=device), device=device)
            learn = Learner(dls, fresh(), loss_func=F.cross_entropy, opt_func=Adam, metrics=accuracy)
            learn.to_bf16()
            learn.to_channelslast()
            learn.logger = lambda *args, **kwargs: None
            return learn

        learner = {"learn": make_learner()}

        def run_epoch():
            learn = learner["learn"]
            with learn.no_bar():
                learn.fit(1, a.lr)
            return (len(xt) // a.bs) * a.bs, float(learn.recorder.values[-1][-1])

        def run_tta():
            learn = learner["learn"] = make_learner()
            start, reached, best = time.perf_counter(), -1.0, 0.0
            from fastai.callback.core import Callback, CancelFitException

            class StopAtTarget(Callback):
                order = 100

                def after_epoch(self):
                    nonlocal reached, best
                    acc = float(self.learn.recorder.values[-1][-1])
                    best = max(best, acc)
                    if acc >= a.target:
                        reached = time.perf_counter() - start
                        raise CancelFitException()

            with learn.no_bar():
                learn.fit_one_cycle(a.epochs, a.lr, cbs=StopAtTarget())
            return reached, best

    print("ready", flush=True)
    for line in sys.stdin:
        request = line.strip()
        torch.cuda.synchronize()
        if request == "epoch":
            start = time.perf_counter()
            items, acc = run_epoch()
            torch.cuda.synchronize()
            print(f"{time.perf_counter() - start:.6f} {items} {acc:.4f}", flush=True)
        elif request == "tta":
            reached, best = run_tta()
            print(f"{reached:.4f} {best:.4f}", flush=True)
        elif request.startswith("trace "):
            from torch.profiler import ProfilerActivity, profile

            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                run_epoch()
                torch.cuda.synchronize()
            prof.export_chrome_trace(request[len("trace "):])
            print("traced", flush=True)
        else:
            print(f"error: unknown request '{request}' (expected 'epoch', 'tta' or 'trace PATH')", flush=True)


if __name__ == "__main__":
    main()
