#include <fastlearn/learner/vision_learner.h>

#include <fastlearn/core/error.h>
#include <fastlearn/data/inference_pipeline.h>
#include <fastlearn/learner/loss.h>
#include <fastlearn/models/memory_format.h>
#include <fastlearn/models/models.h>
#include <fastlearn/models/vision_model.h>

#include <fmt/format.h>

namespace fastlearn {

std::int64_t image_channels(const DataLoaders& dls) {
  if (const auto* pipeline = dls.image_pipeline()) return pipeline->channels();
  const auto& items = dls.train().dataset();
  if (items.size() == 0) return 3;
  const auto item = items.get(0);
  if (item.inputs.empty() || item.inputs[0].dim() != 3) return 3;
  return item.inputs[0].size(0);
}

std::unique_ptr<Learner> vision_learner(DataLoaders dls, const VisionLearnerOptions& options,
                                        LearnerOptions learner_options) {
  if (dls.c() < 1) throw ConfigError("vision_learner: the data has no classes");
  auto model = models::vision_model({.arch = options.arch,
                                     .classes = dls.c(),
                                     .weights = options.weights,
                                     .hidden = options.hidden,
                                     .dropout = options.dropout,
                                     .in_channels = options.in_channels.value_or(image_channels(dls))});
  if (options.channels_last) models::to_channels_last(*model);
  if (!learner_options.splitter) learner_options.splitter = models::body_head_split;
  const bool multi_label = dls.multi_label();
  // The same model as the config's keys build it (registry.cpp) can be exported by those keys.
  const VisionLearnerOptions plain;
  if (options.hidden == plain.hidden && options.dropout == plain.dropout &&
      (!options.in_channels || *options.in_channels == image_channels(dls)) && learner_options.model_recipe.empty())
    learner_options.model_recipe =
        fmt::format("[data]\ndataset = \"{}\"\n{}[model]\narch = \"{}\"\n", multi_label ? "image_csv" : "image_folder",
                    multi_label ? "label_delim = \" \"\n" : "", options.arch);
  auto learn = std::make_unique<Learner>(std::move(dls), model, multi_label ? bce_with_logits() : cross_entropy(),
                                         std::move(learner_options));
  if (!options.weights.empty()) learn->freeze();  // a pretrained body trains only after fine_tune / unfreeze
  return learn;
}

}  // namespace fastlearn
