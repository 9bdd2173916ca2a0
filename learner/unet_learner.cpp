#include <fastlearn/learner/unet_learner.h>

#include <fastlearn/core/error.h>
#include <fastlearn/data/inference_pipeline.h>
#include <fastlearn/learner/segmentation_loss.h>
#include <fastlearn/models/memory_format.h>
#include <fastlearn/models/unet.h>
#include <fmt/format.h>
#include <torch/torch.h>

namespace fastlearn {

std::vector<std::vector<at::Tensor>> unet_split(torch::nn::Module& model) {
  auto* unet = dynamic_cast<models::UnetImpl*>(&model);
  if (unet == nullptr) throw ConfigError("unet_split: the model is not a models::unet");
  std::vector<std::vector<at::Tensor>> groups(3);
  for (const auto& child : unet->named_children()) {
    if (child.key() != "0") {
      for (const auto& p : child.value()->parameters()) groups[2].push_back(p);
      continue;
    }
    for (const auto& part : child.value()->named_children()) {
      const bool deep = part.key() == "layer3" || part.key() == "layer4";
      for (const auto& p : part.value()->parameters()) groups[deep ? 1 : 0].push_back(p);
    }
  }
  return groups;
}

std::unique_ptr<Learner> unet_learner(DataLoaders dls, const UnetLearnerOptions& options, std::optional<Loss> loss,
                                      LearnerOptions learner_options) {
  if (dls.vocab().empty()) throw ConfigError("unet_learner: the data names no codes (SegmentationDataLoaders do)");
  const auto& items = dls.train().dataset();
  if (items.size() == 0) throw ConfigError("unet_learner: the training set is empty");
  const auto first = items.get(0);
  if (first.inputs.empty() || first.inputs[0].dim() != 3) {
    throw ConfigError("unet_learner: the training items are not (C, H, W) images");
  }
  auto model = models::unet({.arch = options.arch,
                             .classes = static_cast<std::int64_t>(dls.vocab().size()),
                             .image_size = {first.inputs[0].size(1), first.inputs[0].size(2)},
                             .weights = options.weights,
                             .in_channels = options.in_channels.value_or(first.inputs[0].size(0)),
                             .blur = options.blur,
                             .blur_final = options.blur_final,
                             .y_range = options.y_range,
                             .last_cross = options.last_cross});
  if (options.channels_last) models::to_channels_last(*model);
  if (!learner_options.splitter) learner_options.splitter = unet_split;
  // The model the config's keys build (registry.cpp) from data that records its images (SegmentationDataLoaders) can be
  // exported by those keys.
  const UnetLearnerOptions plain;
  const auto* pipeline = dls.image_pipeline();
  if (pipeline != nullptr && pipeline->masks && options.blur == plain.blur && options.blur_final == plain.blur_final &&
      !options.y_range && options.last_cross == plain.last_cross && !options.in_channels &&
      learner_options.model_recipe.empty())
    learner_options.model_recipe =
        fmt::format("[data]\ndataset = \"segmentation\"\n[model]\narch = \"unet\"\nbody = \"{}\"\n", options.arch);
  auto learn = std::make_unique<Learner>(std::move(dls), model, loss.value_or(pixel_cross_entropy()),
                                         std::move(learner_options));
  if (!options.weights.empty()) learn->freeze();  // a pretrained body trains only after fine_tune / unfreeze
  return learn;
}

}  // namespace fastlearn
