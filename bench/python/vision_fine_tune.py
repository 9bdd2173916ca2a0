"""Python side of bench/vision_fine_tune.cpp: fastai's vision_learner + fine_tune over the same JPEG files.

  vision_fine_tune.py make DIR N     writes N photo-sized JPEGs into DIR/train/<class>/ and 16 into DIR/valid/
                                     (bench/python/image_pipeline.py's files: 8 classes), and the weights both
                                     sides start from: DIR/resnet18.safetensors, a torchvision resnet18 state
                                     dict (seeded random initialization: no download on either side)
  vision_fine_tune.py serve DIR BS   prints "ready", then for each line "run" on stdin makes a new
                                     vision_learner from those weights, runs fine_tune(1) and prints
                                     "<seconds> <images trained> <valid accuracy>"

The setting, as the C++ side's: Resize(128) items (random crop in training, centre crop in validation),
aug_transforms() and ImageNet normalization on the batches, batch size BS, 2 loader workers, 2 torch threads,
Adam, fastai's fine_tune defaults (one frozen epoch at pct_start 0.99, then one unfrozen epoch).
"""
import sys
import time
import warnings

# The body's layers in create_body's Sequential (indices) against torchvision's names.
BODY = {"conv1": "0", "bn1": "1", "layer1": "4", "layer2": "5", "layer3": "6", "layer4": "7"}


def make(out, n):
    import torch
    import torchvision
    from safetensors.torch import save_file

    sys.path.insert(0, __file__.rsplit("/", 1)[0])
    import image_pipeline
    image_pipeline.make(out, n)
    torch.manual_seed(0)
    model = torchvision.models.resnet18(weights=None)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, f"{out}/resnet18.safetensors")


def serve(root, bs):
    import torch
    from fastai.vision.all import (ImageDataLoaders, Normalize, Resize, accuracy, aug_transforms, imagenet_stats,
                                   resnet18, vision_learner)
    from safetensors.torch import load_file

    warnings.filterwarnings("ignore")
    torch.set_num_threads(2)
    dls = ImageDataLoaders.from_folder(root, train="train", valid="valid", item_tfms=Resize(128), bs=bs,
                                       batch_tfms=[*aug_transforms(), Normalize.from_stats(*imagenet_stats)],
                                       num_workers=2, seed=0)
    state = load_file(f"{root}/resnet18.safetensors")
    body = {}
    for name, tensor in state.items():
        head, rest = name.split(".", 1)
        if head in BODY:
            body[f"{BODY[head]}.{rest}"] = tensor
    print("ready", flush=True)
    for line in sys.stdin:
        if line.strip() != "run":
            continue
        learn = vision_learner(dls, resnet18, pretrained=False, normalize=False, metrics=accuracy)
        learn.model[0].load_state_dict(body, strict=True)
        start = time.perf_counter()
        with learn.no_bar(), learn.no_logging():
            learn.fine_tune(1)
        seconds = time.perf_counter() - start
        images = 2 * len(dls.train) * bs  # two epochs, drop_last
        print(f"{seconds} {images} {float(learn.recorder.values[-1][2])}", flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "make":
        make(sys.argv[2], int(sys.argv[3]))
    else:
        serve(sys.argv[2], int(sys.argv[3]))
