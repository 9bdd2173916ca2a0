"""Python side of bench/batch_inference.cpp: predictions over new JPEG files, by fastai and by a plain PyTorch loop.

  batch_inference.py make DIR N          writes N JPEGs of 160x160 (quality 90) into DIR/new/, cut at random from
                                         the photos scikit-image ships, and a small labelled set for the learners'
                                         DataLoaders: DIR/train/<class>/ and DIR/valid/<class>/ (8 classes)
  batch_inference.py serve DIR WEIGHTS   prints "ready", then for each line on stdin:
                                           "fastai": learn.get_preds(dl=learn.dls.test_dl(files)) over DIR/new
                                           "torch":  a torchvision ImageFolder-style Dataset of DIR/new through a
                                                     DataLoader, the model in eval mode under no_grad
                                         and prints "<seconds> <images> <sum of the probabilities' argmax>"

Both run the same network, fastai's create_vision_model(resnet18, 8) (torchvision's body and fastai's head), with
the weights the C++ side wrote in fastai's names (WEIGHTS, safetensors), on the same items: Resize(128) (the shorter
side to 128, centre crop), to float, ImageNet normalization; batch 64, 2 loader workers, 2 torch threads, the
default (contiguous) memory format.
"""
import os
import sys
import time
import warnings

import numpy as np


def make(out, n):
    import skimage.data as data
    from PIL import Image
    photos = [data.astronaut(), data.coffee(), data.chelsea(), data.rocket(), data.hubble_deep_field(),
              data.immunohistochemistry(), data.retina(), data.camera()]
    rng = np.random.default_rng(0)
    for split, count in (("new", n), ("train", 32), ("valid", 16)):
        for i in range(count):
            k = i % len(photos)
            photo = Image.fromarray(photos[k]).convert("RGB")
            w, h = photo.size
            side = int(rng.integers(160, min(w, h) + 1))
            x, y = int(rng.integers(0, w - side + 1)), int(rng.integers(0, h - side + 1))
            crop = photo.crop((x, y, x + side, y + side)).resize((160, 160), Image.BICUBIC)
            folder = f"{out}/new" if split == "new" else f"{out}/{split}/class{k}"
            os.makedirs(folder, exist_ok=True)
            crop.save(f"{folder}/{i:05d}.jpg", quality=90)
    print("made")


def serve(root, weights):
    import torch
    from fastai.vision.all import (ImageDataLoaders, Normalize, Resize, create_vision_model, get_image_files,
                                   imagenet_stats, resnet18, vision_learner)
    from safetensors.torch import load_file
    from torchvision import transforms
    from PIL import Image

    warnings.filterwarnings("ignore")
    torch.set_num_threads(2)
    state = load_file(weights)
    files = sorted(get_image_files(f"{root}/new"))

    dls = ImageDataLoaders.from_folder(root, train="train", valid="valid", item_tfms=Resize(128), bs=64,
                                       batch_tfms=[Normalize.from_stats(*imagenet_stats)], num_workers=2)
    learn = vision_learner(dls, resnet18, pretrained=False, normalize=False)
    learn.model.load_state_dict(state, strict=True)

    model = create_vision_model(resnet18, 8, pretrained=False)
    model.load_state_dict(state, strict=True)
    model.eval()
    tfm = transforms.Compose([transforms.Resize(128), transforms.CenterCrop(128), transforms.ToTensor(),
                              transforms.Normalize(*imagenet_stats)])

    class Files(torch.utils.data.Dataset):
        def __len__(self):
            return len(files)

        def __getitem__(self, i):
            with open(files[i], "rb") as f:
                return tfm(Image.open(f).convert("RGB"))

    loader = torch.utils.data.DataLoader(Files(), batch_size=64, num_workers=2, persistent_workers=True,
                                         worker_init_fn=lambda _: torch.set_num_threads(1))
    print("ready", flush=True)
    for line in sys.stdin:
        side = line.strip()
        start = time.perf_counter()
        if side == "fastai":
            with learn.no_bar(), learn.no_logging():
                preds = learn.get_preds(dl=learn.dls.test_dl(files))[0]
        elif side == "torch":
            outputs = []
            with torch.no_grad():
                for x in loader:
                    outputs.append(torch.softmax(model(x), dim=1))
            preds = torch.cat(outputs)
        else:
            continue
        seconds = time.perf_counter() - start
        print(f"{seconds} {len(preds)} {int(preds.argmax(1).sum())}", flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "make":
        make(sys.argv[2], int(sys.argv[3]))
    else:
        serve(sys.argv[2], sys.argv[3])
