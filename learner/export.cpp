#include <fastlearn/learner/export.h>

#include <fastlearn/core/build_info.h>
#include <fastlearn/core/detail/text.h>
#include <fastlearn/core/error.h>
#include <fastlearn/learner/learner.h>
#include <fastlearn/models/torchscript.h>
#include <fastlearn/models/weights.h>

#include <fmt/format.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <string_view>

namespace fastlearn {

namespace {

constexpr std::string_view kFormat = "fastlearn-export";

const std::string& required(const Metadata& metadata, const std::string& key, const std::string& origin) {
  const auto it = metadata.find(key);
  if (it == metadata.end())
    throw CheckpointError(fmt::format("{}: not a complete fastlearn export: metadata '{}' is missing", origin, key));
  return it->second;
}

}  // namespace

std::string activation_of(const std::string& loss_name) {
  if (loss_name == "cross_entropy" || loss_name == "pixel_cross_entropy" || loss_name == "dice_loss" ||
      loss_name == "cross_entropy_dice")
    return "softmax";  // the segmentation losses over the class axis (1)
  if (loss_name == "bce_with_logits") return "sigmoid";
  if (loss_name == "mse_loss" || loss_name == "l1_loss") return "none";
  return "unknown";
}

std::filesystem::path export_learner(Learner& learn, const std::filesystem::path& file, double threshold) {
  if (!(threshold > 0 && threshold < 1))
    throw ConfigError(fmt::format("export: threshold {} is not in (0, 1)", threshold));
  if (!learn.coordination().is_main()) return file;
  NamedTensors tensors;
  bool channels_last = false;
  for (auto& [name, t] : models::model_tensors(learn.model())) {
    tensors.emplace_back(name, t.detach());
    channels_last = channels_last || (t.dim() == 4 && !t.is_contiguous() &&
                                      t.is_contiguous(at::MemoryFormat::ChannelsLast) && t.size(1) > 1);
  }
  // A script travels as its code and module tree; its tensors are the model's, above.
  auto* script = dynamic_cast<models::TorchScriptImpl*>(&learn.model());
  if (script) {
    const auto archive = script->archive_without_tensors();
    tensors.emplace_back(kTorchScriptTensor,
                         torch::from_blob(const_cast<char*>(archive.data()),  // NOLINT: read only, cloned at once
                                          {static_cast<std::int64_t>(archive.size())}, at::kByte)
                             .clone());
  }
  const auto& loss = learn.loss_func().name;
  const auto pipeline = inference_pipeline(learn.given_dls());
  // Version 2 for what a version 1 reader cannot take: a script, tensor inputs described as "inputs" (several, or
  // integers), or a table whose layout is not the default (collaborative filtering's); every other export stays 1.
  const bool described_inputs = (pipeline.kind == InferencePipeline::Kind::tensors &&
                                 (pipeline.inputs.size() != 1 || pipeline.inputs[0].dtype != "float32")) ||
                                (pipeline.procs && pipeline.table_layout != TabularLayout{});
  Metadata metadata{{"format", std::string(kFormat)},
                    {"format_version", script || described_inputs ? "2" : "1"},
                    {"fastlearn_version", build_info().fastlearn_version},
                    {"model_recipe", learn.options().model_recipe},
                    {"loss", loss},
                    {"activation", learn.loss_func().activation_name.empty() ? activation_of(loss)
                                                                             : learn.loss_func().activation_name},
                    {"threshold", fmt::format("{}", threshold)},
                    {"channels_last", channels_last ? "true" : "false"},
                    {"pipeline", to_json(pipeline)}};
  if (file.has_parent_path()) std::filesystem::create_directories(file.parent_path());
  save_checked_safetensors(file, tensors, std::move(metadata));
  return file;
}

ExportContents read_export(const std::filesystem::path& file) {
  const auto origin = excerpt(file.string(), 256);
  if (!std::filesystem::is_regular_file(file)) throw CheckpointError(fmt::format("{}: no such export file", origin));
  ExportContents out{.weights = load_safetensors(file)};  // CheckpointError for a truncated or tampered file
  const auto& m = out.weights.metadata;
  const auto format = m.find("format");
  if (format == m.end() || format->second != kFormat) {
    throw CheckpointError(fmt::format(
        "{}: not a fastlearn export (metadata 'format' is {}){}", origin,
        format == m.end() ? std::string("absent") : fmt::format("'{}'", excerpt(format->second)),
        format != m.end() && format->second == "fastlearn-checkpoint"
            ? "; it is a checkpoint: `fastlearn export CONFIG --checkpoint FILE --out DIR` makes an export of it"
            : ""));
  }
  if (!m.contains(std::string(kChecksumKey)))
    throw CheckpointError(fmt::format("{}: the export has no checksums ('{}'): it was altered", origin, kChecksumKey));
  const auto& version = required(m, "format_version", origin);
  if (version != "1" && version != "2") {
    throw CheckpointError(fmt::format(
        "{}: export format version '{}' is not one this build reads (1 to {}): it was written by fastlearn {}; load "
        "it with that version or a newer one",
        origin, excerpt(version), kExportFormatVersion,
        excerpt(m.contains("fastlearn_version") ? m.at("fastlearn_version") : "?")));
  }
  out.fastlearn_version = required(m, "fastlearn_version", origin);
  out.model_recipe = required(m, "model_recipe", origin);
  out.loss = required(m, "loss", origin);
  out.activation = required(m, "activation", origin);
  auto& tensors = out.weights.tensors;
  const auto archive =
      std::find_if(tensors.begin(), tensors.end(), [](const auto& named) { return named.first == kTorchScriptTensor; });
  if (archive != tensors.end()) {
    const auto& bytes = archive->second;
    if (version == "1" || bytes.scalar_type() != at::kByte || bytes.dim() != 1)
      throw CheckpointError(
          fmt::format("{}: tensor '{}' is not a TorchScript archive of a version 2 export (uint8, one "
                      "dimension): the file was altered",
                      origin, kTorchScriptTensor));
    const auto contiguous = bytes.contiguous();
    out.torchscript.assign(static_cast<const char*>(contiguous.data_ptr()),
                           static_cast<std::size_t>(contiguous.numel()));
    tensors.erase(archive);
  }
  const auto& threshold = required(m, "threshold", origin);
  try {
    std::size_t used = 0;
    out.threshold = std::stod(threshold, &used);
    if (used != threshold.size() || !(out.threshold > 0 && out.threshold < 1)) throw std::out_of_range(threshold);
  } catch (const std::exception&) {
    throw CheckpointError(
        fmt::format("{}: metadata 'threshold' is '{}', not a number in (0, 1)", origin, excerpt(threshold)));
  }
  const auto& layout = required(m, "channels_last", origin);
  if (layout != "true" && layout != "false")
    throw CheckpointError(
        fmt::format("{}: metadata 'channels_last' is '{}', not true or false", origin, excerpt(layout)));
  out.channels_last = layout == "true";
  try {
    out.pipeline = inference_pipeline_from_json(required(m, "pipeline", origin), file.string());
  } catch (const DataError& e) {
    throw CheckpointError(e.what());
  }
  return out;
}

std::filesystem::path Learner::export_to(const std::filesystem::path& file, double threshold) {
  const auto path = file.is_absolute() ? file : options_.path / file;
  export_learner(*this, path, threshold);  // rank 0 writes, the others return: no collective, so rank 0 may call alone
  return path;
}

}  // namespace fastlearn
