#pragma once
// fastai's load_learner: a Learner for inference from an export (learner/export.h), without the training data. The
// model is rebuilt from the export's recipe by the registry's entry for its arch (or by the factory given), its
// weights loaded and checked, the loss found by name, and the DataLoaders rebuilt from the inference pipeline with
// no items: new items go through test_dl (ImageDataLoaders, TabularDataLoaders) into get_preds, or one at a time
// through predict_image / predict_row, exactly as the validation items went in training.
//
//   auto learn = fl::load_learner("export.safetensors");
//   auto dl = fl::ImageDataLoaders::test_dl(learn->dls(), files);
//   auto named = fl::name_predictions(learn->get_preds(&dl).preds, *learn);
#include <fastlearn/config/registry.h>
#include <fastlearn/config/train_config.h>
#include <fastlearn/learner/export.h>
#include <fastlearn/learner/learner.h>

#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>

namespace fastlearn {

struct LoadLearnerOptions {
  /// Where the model runs and the batches go. Default: default_device() (a GPU when one is visible, as fastai).
  std::optional<c10::Device> device;
  /// Builds the model of an export whose model is not in the registry (its model_recipe is empty: a model of your
  /// own), from the data's description (classes, image channels, a table's procs); its tensors must match the file's.
  std::function<BuiltModel(const DataLoaders&)> model;
  /// The loss of an export whose loss is not one of the registry's (matched by Loss::name).
  std::optional<Loss> loss;
  std::int64_t bs = 64;  ///< batch size of test_dl's loaders
  int num_workers = 0;   ///< their decoding threads
};

/// The Learner of the export `file`, in eval mode on options.device. CheckpointError naming the file for a file that is
/// not a readable export (read_export), for tensors that do not fit the model, and for an export whose model is of
/// your own when options.model is not given (the error names that option); ConfigError for a recipe this build's
/// registry does not know.
std::unique_ptr<Learner> load_learner(const std::filesystem::path& file, const LoadLearnerOptions& options = {});
/// The same from an export already read (read_export(file)), for a caller that also needs its metadata.
std::unique_ptr<Learner> load_learner(const ExportContents& contents, const std::filesystem::path& file,
                                      const LoadLearnerOptions& options = {});

/// The model recipe of a config (LearnerOptions::model_recipe): data.dataset and its task keys and the [model] table
/// without its pretrained weights, as TOML.
std::string model_recipe(const TrainConfig& config);

}  // namespace fastlearn
