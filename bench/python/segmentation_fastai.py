"""Python side of bench/segmentation_vs_fastai.cpp: fastai's SegmentationDataLoaders + unet_learner on the same files.

  segmentation_fastai.py serve DIR BS LR          prints "ready", then answers lines on stdin:
      "fit SEED EPOCHS"     a new unet_learner (torch seeded with SEED), fit_one_cycle(EPOCHS, LR):
                            "<seconds> <valid dice_multi>"
      "load"                one pass over the training loader alone: "<seconds>"
      "profile EPOCHS FILE" fit_one_cycle(EPOCHS, LR) under torch.profiler, its trace written to FILE: "done"
  segmentation_fastai.py top TRACE [TRACE...]      the operators of each trace by their own CPU time (a table)

The setting, as the C++ side's: DIR/images/*.png with DIR/masks/*.png of the same name (scripts/make-shapes), codes
background, circle, square; RandomSplitter(0.2, seed 42); Resize(64) items; no augmentation and no normalization
(unet_learner without pretrained weights adds none); batch size BS; resnet18 body without pretrained weights; fastai's
default loss (CrossEntropyLossFlat(axis=1)), Adam and wd; DiceMulti; 2 torch threads; no loader workers.
"""
import collections
import json
import sys
import time
import warnings

CODES = ["background", "circle", "square"]


def serve(root, bs, lr):
    import torch
    from fastai.vision.all import (DiceMulti, Resize, SegmentationDataLoaders, get_image_files, resnet18, set_seed,
                                   unet_learner)

    warnings.filterwarnings("ignore")
    torch.set_num_threads(2)
    images = sorted(get_image_files(f"{root}/images"))
    dls = SegmentationDataLoaders.from_label_func(f"{root}", images, lambda f: f"{root}/masks/{f.stem}.png",
                                                  codes=CODES, valid_pct=0.2, seed=42, item_tfms=Resize(64), bs=bs,
                                                  num_workers=0)

    def learner(seed):
        set_seed(seed)
        return unet_learner(dls, resnet18, pretrained=False, n_out=len(CODES), metrics=DiceMulti())

    print("ready", flush=True)
    for line in sys.stdin:
        words = line.split()
        if words[:1] == ["fit"]:
            learn = learner(int(words[1]))
            start = time.perf_counter()
            with learn.no_bar(), learn.no_logging():
                learn.fit_one_cycle(int(words[2]), lr)
            seconds = time.perf_counter() - start
            print(f"{seconds} {float(learn.recorder.values[-1][2])}", flush=True)
        elif words[:1] == ["load"]:
            start = time.perf_counter()
            for _ in dls.train:
                pass
            print(time.perf_counter() - start, flush=True)
        elif words[:1] == ["profile"]:
            learn = learner(0)
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
                with learn.no_bar(), learn.no_logging():
                    learn.fit_one_cycle(int(words[1]), lr)
            prof.export_chrome_trace(words[2])
            print("done", flush=True)


def top(traces, n=14):
    """Each trace's operators (aten::..., the autograd nodes) by self time: the time inside them less their children's."""
    for path in traces:
        with open(path) as f:
            events = [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X" and e.get("cat") == "cpu_op"]
        by_thread = collections.defaultdict(list)
        for e in events:
            by_thread[e.get("tid")].append(e)
        self_us = collections.Counter()
        for evs in by_thread.values():
            evs.sort(key=lambda e: (e["ts"], -e["dur"]))
            stack = []  # (end, name, child time)
            for e in evs:
                while stack and e["ts"] >= stack[-1][0]:
                    end, name, child = stack.pop()
                    self_us[name] -= child
                self_us[e["name"]] += e["dur"]
                if stack:
                    stack[-1][2] += e["dur"]
                stack.append([e["ts"] + e["dur"], e["name"], 0])
            while stack:
                end, name, child = stack.pop()
                self_us[name] -= child
        total = sum(self_us.values())
        print(f"{path}: {total / 1e6:.2f} s of operators")
        for name, us in self_us.most_common(n):
            print(f"  {us / 1e6:8.3f} s  {100 * us / total:5.1f}%  {name}")


if __name__ == "__main__":
    if sys.argv[1] == "serve":
        serve(sys.argv[2], int(sys.argv[3]), float(sys.argv[4]))
    else:
        top(sys.argv[2:])
