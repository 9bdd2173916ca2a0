"""Writes the state dict of fastai's create_unet_model(resnet18, 3, (64, 64)) to the file named by its argument, as a
fastai user saves it for docs/segmentation.md's "fastai's weights, in and out"."""
import sys

import torch
from fastai.vision.learner import create_unet_model
from safetensors.torch import save_file
from torchvision.models import resnet18

torch.manual_seed(0)
model = create_unet_model(resnet18, 3, (64, 64), pretrained=False)
save_file({k: v.contiguous() for k, v in model.state_dict().items()}, sys.argv[1])
