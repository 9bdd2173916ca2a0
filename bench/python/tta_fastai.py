"""The fastai side of bench/time_to_accuracy.cpp: fit_one_cycle on Fashion-MNIST until the first epoch whose
test accuracy reaches --target; rank 0 prints {"reached": .., "epochs": .., "accuracy": .., "train_seconds": .., "history": [..]}.

Started by torchrun on 2 ranks, it trains through fastai's own data parallel path, Learner.distrib_ctx()
(DistributedTrainer + DistributedDL over accelerate), with a Gloo process group set up first as there is no
GPU. --single runs one process instead (the anchor when the distributed path cannot run; see bench/README.md).
usage: tta_fastai.py --model NAME --epochs E --lr LR --bs B --target T --data DIR [--single] [--channels-last]
"""
import argparse
import json
import os
import time

import torch
import torch.nn.functional as F

import fashion


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True)
    p.add_argument("--epochs", type=int, required=True)
    p.add_argument("--lr", type=float, required=True)
    p.add_argument("--bs", type=int, required=True)
    p.add_argument("--target", type=float, required=True)
    p.add_argument("--data", required=True)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--single", action="store_true")
    p.add_argument("--channels-last", action="store_true", help="fastai's ChannelsLast callback (no mixed precision)")
    a = p.parse_args()

    from fastai.callback.core import Callback, CancelFitException
    from fastai.data.core import DataLoaders
    from fastai.data.load import DataLoader
    from fastai.learner import Learner
    from fastai.metrics import accuracy
    from fastai.optimizer import Adam
    from fastai.torch_core import set_seed
    import fastai.callback.progress  # noqa: F401  (adds Learner.no_bar)
    import fastai.callback.schedule  # noqa: F401  (adds Learner.fit_one_cycle)
    import fastai.distributed  # noqa: F401  (adds Learner.distrib_ctx)
    from torch.utils.data import TensorDataset

    distributed = not a.single and int(os.environ.get("WORLD_SIZE", "1")) > 1
    if distributed:
        torch.distributed.init_process_group("gloo")
    rank = torch.distributed.get_rank() if distributed else 0
    set_seed(a.seed)
    xt, yt, xv, yv = fashion.load(a.data)
    dls = DataLoaders(DataLoader(TensorDataset(xt, yt), bs=a.bs, shuffle=True, drop_last=True),
                      DataLoader(TensorDataset(xv, yv), bs=2 * a.bs), device="cpu")

    class StopAtAccuracy(Callback):
        order = 60  # after the Recorder has the epoch's metrics

        def __init__(self):
            self.reached, self.epochs, self.accuracy, self.history = False, 0, 0.0, []

        def after_epoch(self):
            self.accuracy = float(self.learn.recorder.values[-1][-1])
            self.epochs += 1
            self.history.append(round(self.accuracy, 4))
            if self.accuracy >= a.target:
                self.reached = True
                raise CancelFitException()

    stop = StopAtAccuracy()
    cbs = [stop]
    if a.channels_last:
        from fastai.callback.channelslast import ChannelsLast
        cbs.append(ChannelsLast())
    learn = Learner(dls, fashion.model(a.model), loss_func=F.cross_entropy, opt_func=Adam, metrics=accuracy, cbs=cbs)
    learn.logger = lambda *args, **kwargs: None
    start = time.perf_counter()
    with learn.no_bar():
        if distributed:
            with learn.distrib_ctx(cpu=True):  # accelerate ignores the process group on CPU without it
                learn.fit_one_cycle(a.epochs, a.lr)
        else:
            learn.fit_one_cycle(a.epochs, a.lr)
    seconds = time.perf_counter() - start
    if rank == 0:
        print(json.dumps({"reached": stop.reached, "epochs": stop.epochs, "accuracy": round(stop.accuracy, 4),
                          "train_seconds": round(seconds, 2), "history": stop.history}), flush=True)
    if distributed:
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
