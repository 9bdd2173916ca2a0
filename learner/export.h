#pragma once
// A trained Learner as one file for inference (fastai's learn.export): a safetensors file with the model's
// parameters and buffers under their module names (Python's safetensors.torch.load_file reads them) and metadata
// with everything predicting needs and nothing of the training data. load_learner (config/load_learner.h) builds
// the Learner again from it. The metadata, all strings (docs/checkpoints.md "Export"):
//   format "fastlearn-export", format_version "1", or "2" for an export that carries a TorchScript model, a
//   pipeline of several (or integer) tensor inputs, or a table of another layout (TabularLayout: ratings);
//   fastlearn_version;
//   model_recipe  the config keys that build the model again ([data] dataset and task, [model] arch and options, as
//                 TOML; empty for a model of your own, which load_learner then needs a factory for);
//   loss          the loss's name (its activation and decoding turn outputs into predictions);
//   activation    "softmax", "sigmoid" or "none": what the loss applies to the model's outputs, for other readers;
//   threshold     multi-label: the probability at which a class counts as predicted;
//   channels_last "true" when the model's convolutions were in channels-last memory format (the loaded model is
//                 too, and so computes the same values);
//   pipeline      JSON of the InferencePipeline (data/inference_pipeline.h): image decoding, resizing and
//                 normalization, a table's procs and column roles, item shape, classes or target names;
//   fastlearn.crc32  every tensor's CRC-32, checked when the file is read.
// A TorchScript model (models/torchscript.h) travels as its archive without tensors, a uint8 tensor named
// "fastlearn/torchscript" (a name no module's tensor can have), beside its tensors under their names: load_learner
// needs neither the .pt file nor Python.
#include <fastlearn/core/safetensors.h>
#include <fastlearn/data/inference_pipeline.h>

#include <filesystem>
#include <string>

namespace fastlearn {

class Learner;

/// The newest format version this build writes and reads (it reads every version since 1).
inline constexpr int kExportFormatVersion = 2;
/// The tensor holding a TorchScript model's archive.
inline constexpr const char* kTorchScriptTensor = "fastlearn/torchscript";

/// What an export file holds, read and checked.
struct ExportContents {
  SafetensorsContent weights;  ///< the model's tensors (metadata included)
  InferencePipeline pipeline;
  std::string model_recipe;
  std::string loss;
  std::string activation;  ///< "softmax", "sigmoid", "none" or "unknown" (metadata 'activation')
  /// A TorchScript model's archive without its tensors (kTorchScriptTensor; taken out of `weights`); empty otherwise.
  std::string torchscript;
  double threshold = 0.5;
  bool channels_last = false;
  std::string fastlearn_version;  ///< the build that wrote it
};

/// Writes `learn`'s model and inference pipeline into `file` atomically (its folder is created) and returns the path.
/// `threshold`: multi-label decoding's. On the main process only in a job of several (the others return at once).
std::filesystem::path export_learner(Learner& learn, const std::filesystem::path& file, double threshold = 0.5);

/// Reads an export: CheckpointError naming the file and the problem when it is not one (a checkpoint, another file,
/// a newer format version), is truncated or tampered with (CRC-32), or its metadata is inconsistent.
ExportContents read_export(const std::filesystem::path& file);

/// "softmax", "sigmoid" or "none" for a loss of fastlearn's by its name (Loss::name); "unknown" for others.
std::string activation_of(const std::string& loss_name);

}  // namespace fastlearn
