"""Python side of bench/image_pipeline.cpp: torchvision's ImageFolder + DataLoader over the same JPEG files.

  image_pipeline.py make DIR N      writes N photo-sized JPEGs (300 to 500 px a side, quality 90) into
                                    DIR/train/<class>/ (and 16 into DIR/valid/), cut at random from the
                                    photos scikit-image ships (astronaut, coffee, chelsea, rocket, ...)
  image_pipeline.py serve DIR W     prints "ready", then for each line "epoch" on stdin iterates one epoch
                                    of DIR/train and prints "<seconds> <images>"

The pipeline per image, as the C++ side's: decode (PIL, with draft mode: libjpeg's scaled decoding),
RandomResizedCrop(224), RandomHorizontalFlip, to float, Normalize(ImageNet); collated into batches of 64
(drop_last) by W worker processes, one torch thread each.
"""
import os
import sys
import time

import numpy as np


def make(out, n):
    import skimage.data as data
    from PIL import Image
    photos = [data.astronaut(), data.coffee(), data.chelsea(), data.rocket(), data.hubble_deep_field(),
              data.immunohistochemistry(), data.retina(), data.motorcycle_left() if hasattr(data, "motorcycle_left") else data.coffee()]
    rng = np.random.default_rng(0)
    for split, count in (("train", n), ("valid", 16)):
        for i in range(count):
            k = i % len(photos)
            photo = Image.fromarray(photos[k]).convert("RGB")
            side = int(rng.integers(300, 501))
            w, h = photo.size
            scale = side / min(w, h)
            photo = photo.resize((max(side, int(w * scale)), max(side, int(h * scale))), Image.BICUBIC)
            w, h = photo.size
            x, y = int(rng.integers(0, w - side + 1)), int(rng.integers(0, h - side + 1))
            tall = int(rng.integers(300, 501))
            crop = photo.crop((x, y, x + side, y + side)).resize((side, tall), Image.BICUBIC)
            folder = f"{out}/{split}/class{k}"
            os.makedirs(folder, exist_ok=True)
            crop.save(f"{folder}/{i:05d}.jpg", quality=90)
    print("made")


def serve(root, workers):
    import torch
    from PIL import Image
    from torchvision import datasets, transforms
    torch.set_num_threads(1)

    def load(path):
        with open(path, "rb") as f:
            image = Image.open(f)
            image.draft("RGB", (224, 224))  # scaled JPEG decoding, as the C++ side's
            return image.convert("RGB")

    tfm = transforms.Compose([
        transforms.RandomResizedCrop(224),
        transforms.RandomHorizontalFlip(),
        transforms.ToTensor(),
        transforms.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225]),
    ])
    ds = datasets.ImageFolder(f"{root}/train", transform=tfm, loader=load)
    dl = torch.utils.data.DataLoader(ds, batch_size=64, shuffle=True, drop_last=True, num_workers=workers,
                                     persistent_workers=workers > 0,
                                     worker_init_fn=lambda _: torch.set_num_threads(1))
    print("ready", flush=True)
    for line in sys.stdin:
        if line.strip() != "epoch":
            continue
        start = time.perf_counter()
        images = 0
        for x, _ in dl:
            images += len(x)
        print(f"{time.perf_counter() - start} {images}", flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "make":
        make(sys.argv[2], int(sys.argv[3]))
    else:
        serve(sys.argv[2], int(sys.argv[3]))
