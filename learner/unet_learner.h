#pragma once
// fastai's unet_learner: models::unet (a torchvision ResNet body, optionally with exported torchvision weights, and
// fastai's decoder) for the data's codes and item size, with pixel_cross_entropy by default, fastai's three parameter
// groups (unet_split) for discriminative learning rates and fine_tune, and, as fastai does for pretrained weights, the
// body frozen until fine_tune or unfreeze. The data's normalization is the loaders' (ImageFilesOptions::normalize):
// fastai normalizes with ImageNet's statistics only for pretrained weights; ask for `none` without them.
#include <fastlearn/learner/learner.h>

#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace fastlearn {

struct UnetLearnerOptions {
  std::string arch = "resnet34";  ///< the body: resnet18 | resnet34 | resnet50
  std::filesystem::path weights;  ///< a torchvision state dict (safetensors) for the body; empty: random
  bool blur = false;              ///< models::UnetOptions' blur, blur_final, y_range and last_cross (fastai's)
  bool blur_final = true;
  std::optional<std::pair<double, double>> y_range;
  bool last_cross = true;
  /// The model in channels-last memory format (models/memory_format.h): the same values, and fastlearn's direct
  /// convolution kernels and oneDNN's take it without converting every activation (bench segmentation_vs_fastai).
  bool channels_last = true;
  /// Channels of the images. Default: image_channels(dls). Pretrained weights for another count are adapted.
  std::optional<std::int64_t> in_channels;
};

/// fastai's _resnet_split of a U-Net: the stem with layer1 and layer2, layer3 with layer4, and the decoder (every
/// tensor after the body). ConfigError for a model that is not a models::unet.
std::vector<std::vector<at::Tensor>> unet_split(torch::nn::Module& unet);

/// A Learner over models::unet for `dls` (which must name its codes): classes = its codes, image_size = the height
/// and width of its training items. `loss` defaults to pixel_cross_entropy; `learner_options.splitter`, when empty,
/// becomes unet_split.
std::unique_ptr<Learner> unet_learner(DataLoaders dls, const UnetLearnerOptions& options = {},
                                      std::optional<Loss> loss = std::nullopt, LearnerOptions learner_options = {});

}  // namespace fastlearn
