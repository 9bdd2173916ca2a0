"""Oracle for fastlearn's resize_image: what fastai's Resize gives a PIL image in validation (centred window).

usage: resize_oracle.py OUT_DIR

Writes OUT_DIR/in_<w>x<h>.png (seeded random RGB images of a few shapes, among them slivers narrower than
the padding they need) and OUT_DIR/out_<w>x<h>_<size>_<method>_<pad_mode>.png: fastai's
Resize(size, method, pad_mode) of that image with split_idx=1, as a PNG (lossless), for the C++ test to
compare pixel for pixel. <size> is a side, or <height>x<width> for fastai's Resize((height, width)).
For masks, OUT_DIR/mask_in_<w>x<h>.png (random class indices 0..3, grey) and
OUT_DIR/mask_out_<w>x<h>_<size>_<method>_<pad_mode>.png: the same Resize of it as a PILMask (nearest).
"""
import sys
from pathlib import Path

import numpy as np
from PIL import Image
from fastai.vision.all import PadMode, PILImage, PILMask, Resize, ResizeMethod

out = Path(sys.argv[1])
out.mkdir(parents=True, exist_ok=True)
rng = np.random.default_rng(0)
for w, h in [(64, 40), (40, 64), (30, 30), (50, 7), (3, 50), (97, 61)]:
    pixels = rng.integers(0, 256, size=(h, w, 3), dtype=np.uint8)
    Image.fromarray(pixels).save(out / f"in_{w}x{h}.png")
    Image.fromarray(rng.integers(0, 4, size=(h, w), dtype=np.uint8), "L").save(out / f"mask_in_{w}x{h}.png")
    image = PILImage.create(out / f"in_{w}x{h}.png")
    mask = PILMask.create(out / f"mask_in_{w}x{h}.png")
    for size in (24, 32, (24, 40), (40, 24)):
        named = size if isinstance(size, int) else f"{size[0]}x{size[1]}"
        for method in (ResizeMethod.Crop, ResizeMethod.Pad, ResizeMethod.Squish):
            for pad_mode in (PadMode.Reflection, PadMode.Zeros, PadMode.Border):
                if method != ResizeMethod.Pad and pad_mode != PadMode.Reflection:
                    continue
                resize = Resize(size, method=method, pad_mode=pad_mode)
                resize(image, split_idx=1).save(out / f"out_{w}x{h}_{named}_{method}_{pad_mode}.png")
                resize(mask, split_idx=1).save(out / f"mask_out_{w}x{h}_{named}_{method}_{pad_mode}.png")
