"""The fastai side of tests/learner/segmentation_metrics_test.cpp: fastai's segmentation losses and metrics on fixed
predictions and targets.

  python fastai_segmentation_metrics_oracle.py OUT   writes OUT/batches.safetensors ("pred<k>" (N, C, H, W) scores and
      "targ<k>" (N, H, W) int64 classes for batches k = 0..3 of 3 classes, and "binary_pred<k>" / "binary_targ<k>" of 2)
      and OUT/fastai.safetensors: "ce" and "dice_loss" of batch 0 (CrossEntropyLossFlat(axis=1) and
      DiceLoss(reduction="mean"); "dice_loss_sum" with fastai's default sum), and each metric accumulated over the four
      batches as fastai's Learner does ("dice_multi", "jaccard_coeff_multi", "dice", "jaccard_coeff" on the binary
      batches, "foreground_acc" fastai's batch-size-weighted average, "foreground_acc_batch0" of batch 0 alone).
"""
import sys
from types import SimpleNamespace

import torch
from fastai.losses import CrossEntropyLossFlat, DiceLoss
from fastai.metrics import Dice, DiceMulti, JaccardCoeff, JaccardCoeffMulti, foreground_acc
from safetensors.torch import save_file

g = torch.Generator().manual_seed(0)
batches = {}
sizes = [4, 4, 4, 2]  # the last batch smaller: fastai's weighting by items then differs from a pixel average
for k, n in enumerate(sizes):
    batches[f"pred{k}"] = torch.randn(n, 3, 6, 7, generator=g) * 2
    targ = torch.randint(0, 3, (n, 6, 7), generator=g)
    targ[targ == 1] = torch.randint(0, 2, (int((targ == 1).sum()),), generator=g) * 2 * (k % 2)  # uneven foreground
    batches[f"targ{k}"] = targ
    batches[f"binary_pred{k}"] = torch.randn(n, 2, 6, 7, generator=g)
    batches[f"binary_targ{k}"] = torch.randint(0, 2, (n, 6, 7), generator=g)
save_file(batches, f"{sys.argv[1]}/batches.safetensors")


def accumulated(metric, prefix=""):
    metric.reset()
    for k in range(len(sizes)):
        metric.accumulate(SimpleNamespace(pred=batches[f"{prefix}pred{k}"], y=batches[f"{prefix}targ{k}"]))
    return metric.value


total, count = 0.0, 0
for k, n in enumerate(sizes):  # fastai's AvgMetric: each batch's value times its item count
    total += foreground_acc(batches[f"pred{k}"], batches[f"targ{k}"]).item() * n
    count += n
values = {
    "ce": CrossEntropyLossFlat(axis=1)(batches["pred0"], batches["targ0"]),
    "dice_loss": DiceLoss(reduction="mean")(batches["pred0"], batches["targ0"]),
    "dice_loss_sum": DiceLoss()(batches["pred0"], batches["targ0"]),
    "dice_multi": accumulated(DiceMulti()),
    "jaccard_coeff_multi": accumulated(JaccardCoeffMulti()),
    "dice": accumulated(Dice(), "binary_"),
    "jaccard_coeff": accumulated(JaccardCoeff(), "binary_"),
    "foreground_acc": total / count,
    "foreground_acc_batch0": foreground_acc(batches["pred0"], batches["targ0"]).item(),
}
save_file({k: torch.tensor(float(v), dtype=torch.float64) for k, v in values.items()}, f"{sys.argv[1]}/fastai.safetensors")
