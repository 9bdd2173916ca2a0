#pragma once
// Batch transforms: functions applied to whole batches after collation, on the batch's device (the
// loader's workers on the CPU, the GPU after the copy on CUDA). Random ones draw from the CPU generator
// they are given, seeded per batch by the DataLoader, so results depend on (seed, epoch, batch) only,
// never on the number of workers or the device.
#include <fastlearn/data/batch.h>

#include <ATen/core/Generator.h>

#include <functional>
#include <vector>

namespace fastlearn {

using BatchTransform = std::function<void(Batch& batch, at::Generator& rng)>;

/// Converts input 0 to float32 and multiplies by `scale` (1/255 turns bytes into [0, 1]).
BatchTransform to_float(double scale = 1.0 / 255.0);

/// Normalizes input 0, shaped (N, C, ...), per channel: (x - mean[c]) / std[c]. One value applies to every channel.
BatchTransform normalize(std::vector<double> mean, std::vector<double> std);

/// to_float(scale) then normalize(mean, std) in one pass, with the same values bit for bit: what the loaders use
/// when nothing comes between the two. A contiguous CPU uint8 or float32 input takes the single pass; any other
/// input (on the GPU, strided, other types) goes through the two transforms.
BatchTransform to_normalized_float(double scale, std::vector<double> mean, std::vector<double> std);

/// Pads input 0, shaped (N, C, H, W), by `padding` zeros on each side, then crops a random size x size
/// window per image (the classic CIFAR/MNIST augmentation).
BatchTransform random_crop(std::int64_t size, std::int64_t padding);

/// Flips each image of input 0, shaped (N, C, H, W), left-right with probability `p`. With `masks`, target 0 holds
/// the images' segmentation masks, (N, H, W), and each flips with its image.
BatchTransform random_flip(double p = 0.5, bool masks = false);

/// fastai's Dihedral (aug_transforms with flip_vert): with probability `p` each square image of input 0 (and with
/// `masks` its mask in target 0) goes through one of the square's 8 symmetries (flips and transposition), drawn
/// uniformly; exact, as pixels only move. DataError for images that are not square.
BatchTransform dihedral(double p = 0.5, bool masks = false);

}  // namespace fastlearn
