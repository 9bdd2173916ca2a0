#pragma once
// The batch transforms that make image batches (uint8, as loaded) the model's input, shared by the image loaders
// (classification, segmentation): to float in [0, 1], the training augmentations in between, the normalization.
#include <fastlearn/data/image_dataloaders.h>
#include <fastlearn/data/image_dataset.h>

#include <memory>
#include <utility>
#include <vector>

namespace fastlearn {

/// The per-channel statistics the images are normalized by, as options.normalize says: torchvision's ImageNet
/// statistics (their means for grey images), `computed`, or none (both empty).
std::pair<std::vector<double>, std::vector<double>> model_input_mean_std(const ImageFilesOptions& options,
                                                                         const ChannelStatistics& computed);

/// to_float, then `between` (augmentations of images in [0, 1]), then the normalization; with nothing between, the
/// two are one pass (to_normalized_float).
std::vector<BatchTransform> to_model_input(const ImageFilesOptions& options, const ChannelStatistics& computed,
                                           std::vector<BatchTransform> between = {});

/// The training and validation loaders of image datasets as `options` ask: training batches shuffled, a last partial
/// batch dropped, flipped (or, with flip_vert, turned by the square's symmetries) and augmented; both made the model's
/// input (to_model_input with `stats`). With `masks`, target 0 holds the images' masks, moved with them.
std::pair<DataLoader, DataLoader> image_loaders(std::shared_ptr<const Dataset> train,
                                                std::shared_ptr<const Dataset> valid, const ImageFilesOptions& options,
                                                const ChannelStatistics& stats, bool masks);

}  // namespace fastlearn
