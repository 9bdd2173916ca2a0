#pragma once
// fastai's vision_learner: models::vision_model (a torchvision ResNet body, optionally with exported
// torchvision weights, and fastai's head) sized for the data's classes, with cross entropy (BCE on logits
// for multi-label data), the body / head split that fine_tune uses, and, as fastai does for pretrained
// weights, the body frozen until fine_tune or unfreeze. Unlike fastai, the model is channels-last by default.
#include <fastlearn/learner/learner.h>

#include <filesystem>
#include <memory>
#include <optional>
#include <string>

namespace fastlearn {

struct VisionLearnerOptions {
  std::string arch = "resnet18";  ///< resnet18 | resnet34 | resnet50
  std::filesystem::path weights;  ///< a torchvision state dict (safetensors) for the body; empty: random
  std::int64_t hidden = 512;      ///< the head's hidden width
  double dropout = 0.5;           ///< the head's last dropout (the first gets half)
  /// The model in channels-last memory format (models/memory_format.h): the same values, faster
  /// convolutions (bench vision_fine_tune). The batches need no conversion: the first convolution does it.
  bool channels_last = true;
  /// Channels of the images (grey: 1). Default: image_channels(dls). Pretrained weights for another count
  /// than 3 are adapted as fastai adapts them (models::first_layer_weights).
  std::optional<std::int64_t> in_channels;
};

/// The channels of the training set's images: the first dimension of its first item's input (C, H, W); 3 when
/// the set is empty or its items are not images.
std::int64_t image_channels(const DataLoaders& dls);

/// A Learner over vision_model for `dls` (which must name its classes). `learner_options.splitter`, when
/// empty, becomes body_head_split.
std::unique_ptr<Learner> vision_learner(DataLoaders dls, const VisionLearnerOptions& options = {},
                                        LearnerOptions learner_options = {});

}  // namespace fastlearn
