#include <fastlearn/data/inference_pipeline.h>

#include <fastlearn/core/detail/text.h>
#include <fastlearn/core/error.h>
#include <fastlearn/data/image_dataset.h>
#include <fastlearn/data/tabular_dataloaders.h>
#include <fastlearn/data/transforms.h>

#include <fmt/format.h>
#include <torch/torch.h>

#include <nlohmann/json.hpp>

#include <cmath>

namespace fastlearn {

namespace {

using nlohmann::json;

// Bounds on what a pipeline may claim, checked before anything of that size is made.
constexpr std::int64_t kMaxImageSide = 4096;  // 3 x 4096 x 4096 bytes an item
constexpr std::int64_t kMaxItemValues = std::int64_t{1} << 31;
constexpr std::int64_t kMaxOutputs = 1 << 24;

const char* name_of(InferencePipeline::Kind kind) {
  switch (kind) {
    case InferencePipeline::Kind::images:
      return "images";
    case InferencePipeline::Kind::table:
      return "table";
    case InferencePipeline::Kind::tensors:
      return "tensors";
    case InferencePipeline::Kind::none:
      break;
  }
  return "none";
}

const char* name_of(ResizeMethod method) {
  switch (method) {
    case ResizeMethod::pad:
      return "pad";
    case ResizeMethod::squish:
      return "squish";
    case ResizeMethod::crop:
      break;
  }
  return "crop";
}

const char* name_of(PadMode mode) {
  switch (mode) {
    case PadMode::zeros:
      return "zeros";
    case PadMode::border:
      return "border";
    case PadMode::reflection:
      break;
  }
  return "reflection";
}

// A field of `j`, as T; DataError naming `field` when it is absent or of another type.
template <class T>
T field(const json& j, const char* field) {
  const auto it = j.find(field);
  if (it == j.end()) throw DataError(fmt::format("no field \"{}\"", field));
  try {
    return it->get<T>();
  } catch (const json::exception&) {
    throw DataError(fmt::format("field \"{}\" has the wrong type ({})", field, it->type_name()));
  }
}

ImagePipeline image_from_json(const json& j) {
  ImagePipeline p;
  const auto mode = field<std::string>(j, "mode");
  if (mode != "rgb" && mode != "gray")
    throw DataError(fmt::format("image.mode \"{}\" is not \"rgb\" or \"gray\"", excerpt(mode)));
  p.mode = mode == "gray" ? ImageMode::gray : ImageMode::rgb;
  // One side for square items, [height, width] otherwise.
  const auto size = j.find("size");
  if (size != j.end() && size->is_array()) {
    const auto sides = field<std::vector<std::int64_t>>(j, "size");
    if (sides.size() != 2) throw DataError(fmt::format("image.size has {} values, not [height, width]", sides.size()));
    p.size = {sides[0], sides[1]};
  } else {
    const auto side = field<std::int64_t>(j, "size");
    p.size = {side, side};
  }
  if (p.size.height < 1 || p.size.height > kMaxImageSide || p.size.width < 1 || p.size.width > kMaxImageSide)
    throw DataError(
        fmt::format("image.size {}x{} is not in [1, {}] on each side", p.size.height, p.size.width, kMaxImageSide));
  p.method = resize_method(field<std::string>(j, "resize"));
  p.pad_mode = pad_mode(field<std::string>(j, "pad_mode"));
  p.decode_min_side = field<std::int64_t>(j, "decode_min_side");
  if (p.decode_min_side < 0 || p.decode_min_side > kMaxImageSide)
    throw DataError(fmt::format("image.decode_min_side {} is not in [0, {}]", p.decode_min_side, kMaxImageSide));
  p.mean = field<std::vector<double>>(j, "mean");
  p.std = field<std::vector<double>>(j, "std");
  if (p.mean.size() != p.std.size() || (!p.mean.empty() && static_cast<std::int64_t>(p.mean.size()) != p.channels()))
    throw DataError(
        fmt::format("image.mean and image.std need {} value(s) each for \"{}\" images, or none; they have "
                    "{} and {}",
                    p.channels(), mode, p.mean.size(), p.std.size()));
  for (std::size_t i = 0; i < p.std.size(); ++i)
    if (!std::isfinite(p.mean[i]) || !std::isfinite(p.std[i]) || p.std[i] <= 0)
      throw DataError(
          fmt::format("image channel {}: mean {} and std {} must be finite, the std above 0", i, p.mean[i], p.std[i]));
  if (j.contains("masks")) p.masks = field<bool>(j, "masks");
  return p;
}

json image_to_json(const ImagePipeline& p) {
  json j{{"mode", p.mode == ImageMode::gray ? "gray" : "rgb"},
         {"size", p.size.height == p.size.width ? json(p.size.height) : json::array({p.size.height, p.size.width})},
         {"resize", name_of(p.method)},
         {"pad_mode", name_of(p.pad_mode)},
         {"decode_min_side", p.decode_min_side},
         {"mean", p.mean},
         {"std", p.std}};
  if (p.masks) j["masks"] = true;  // written only for segmentation: a classification's JSON is as before
  return j;
}

InferencePipeline from_json(const json& j, const std::string& origin) {
  if (!j.is_object()) throw DataError("not a JSON object");
  InferencePipeline p;
  const auto kind = field<std::string>(j, "kind");
  if (kind == "images")
    p.kind = InferencePipeline::Kind::images;
  else if (kind == "table")
    p.kind = InferencePipeline::Kind::table;
  else if (kind == "tensors")
    p.kind = InferencePipeline::Kind::tensors;
  else if (kind != "none")
    throw DataError(
        fmt::format("kind \"{}\" is not one of \"images\", \"table\", \"tensors\", \"none\"", excerpt(kind)));
  p.c = field<std::int64_t>(j, "c");
  if (p.c < 1 || p.c > kMaxOutputs) throw DataError(fmt::format("c {} is not in [1, {}]", p.c, kMaxOutputs));
  p.vocab = field<std::vector<std::string>>(j, "vocab");
  p.multi_label = field<bool>(j, "multi_label");
  for (std::size_t i = 0; i < p.vocab.size(); ++i)
    require_utf8(p.vocab[i], fmt::format("{}: vocab #{}", excerpt(origin, 256), i), "export the model again");
  if (!p.vocab.empty() && static_cast<std::int64_t>(p.vocab.size()) != p.c)
    throw DataError(fmt::format("the vocabulary has {} names for c = {} classes", p.vocab.size(), p.c));
  if (p.multi_label && p.vocab.empty()) throw DataError("multi_label without a vocabulary");

  switch (p.kind) {
    case InferencePipeline::Kind::images:
      p.image = image_from_json(field<json>(j, "image"));
      if (p.image->masks && (p.vocab.empty() || p.multi_label || p.c > 256))
        throw DataError(fmt::format(
            "image.masks (segmentation) needs the codes as the vocabulary, one class per pixel, at most 256; c = {}",
            p.c));
      break;
    case InferencePipeline::Kind::table: {
      const auto table = field<json>(j, "table");
      auto procs = TabularProcs::from_json(field<json>(table, "procs").dump(), origin);
      for (std::size_t i = 0; i < procs.vocabs().size(); ++i)
        if (procs.vocabs()[i].empty())
          throw DataError(fmt::format("the procs' vocabulary of '{}' is empty", excerpt(procs.cat_names()[i])));
      p.procs = std::make_shared<const TabularProcs>(std::move(procs));
      p.y_names = field<std::vector<std::string>>(table, "y_names");
      p.regression = field<bool>(table, "regression");
      // Written only when not the default (collaborative filtering): a table's JSON is otherwise as before.
      if (table.contains("with_cont")) p.table_layout.with_cont = field<bool>(table, "with_cont");
      if (table.contains("known_categories_only"))
        p.table_layout.known_categories_only = field<bool>(table, "known_categories_only");
      if (!p.table_layout.with_cont && !p.procs->cont_names().empty())
        throw DataError("table.with_cont is false, and the procs have continuous columns");
      if (p.y_names.empty()) throw DataError("table.y_names is empty");
      if (p.regression && static_cast<std::int64_t>(p.y_names.size()) != p.c)
        throw DataError(fmt::format("a regression of {} target(s) with c = {}", p.y_names.size(), p.c));
      if (!p.regression && (p.y_names.size() != 1 || p.vocab.empty()))
        throw DataError("a table's classification needs one target column and a vocabulary");
      break;
    }
    case InferencePipeline::Kind::tensors: {
      // One float input as "item_shape" (what every export wrote before several inputs); else "inputs".
      if (j.contains("inputs")) {
        const auto& inputs = j.at("inputs");
        if (!inputs.is_array() || inputs.empty() || inputs.size() > 16)
          throw DataError("inputs is not a list of 1 to 16 inputs");
        for (const auto& input : inputs)
          p.inputs.push_back(
              {.shape = field<std::vector<std::int64_t>>(input, "shape"), .dtype = field<std::string>(input, "dtype")});
      } else {
        p.inputs.push_back({.shape = field<std::vector<std::int64_t>>(j, "item_shape")});
      }
      std::int64_t values = 1;
      for (const auto& input : p.inputs) {
        if (input.dtype != "float32" && input.dtype != "int64" && input.dtype != "int32")
          throw DataError(fmt::format("an input's dtype is \"{}\", not float32, int64 or int32", excerpt(input.dtype)));
        for (const auto d : input.shape) {
          if (d < 1 || d > kMaxItemValues / values)
            throw DataError(fmt::format("item_shape has a dimension {} out of range (at most {} values an item)", d,
                                        kMaxItemValues));
          values *= d;
        }
      }
      break;
    }
    case InferencePipeline::Kind::none:
      break;
  }
  return p;
}

}  // namespace

std::vector<BatchTransform> image_input_transforms(std::vector<double> mean, std::vector<double> std) {
  if (mean.empty()) return {to_float(1.0 / 255.0)};
  return {to_normalized_float(1.0 / 255.0, std::move(mean), std::move(std))};
}

InferencePipeline inference_pipeline(const DataLoaders& dls) {
  InferencePipeline p{.c = dls.c(), .vocab = dls.vocab(), .multi_label = dls.multi_label()};
  if (const auto* image = dls.image_pipeline()) {
    p.kind = InferencePipeline::Kind::images;
    p.image = *image;
  } else if (const auto* table = tabular_dataset(dls)) {
    p.kind = InferencePipeline::Kind::table;
    p.procs = table->procs_ptr();
    p.y_names = table->y_names();
    p.regression = table->regression();
    p.table_layout = table->layout();
  } else if (const auto* tensors = dynamic_cast<const TensorDataset*>(&dls.train().dataset());
             tensors && !tensors->inputs().empty() && tensors->inputs().size() <= 16) {
    std::vector<TensorInput> inputs;
    for (const auto& t : tensors->inputs()) {
      const auto dtype = t.is_floating_point()          ? "float32"  // as before several inputs: read as float32
                         : t.scalar_type() == at::kLong ? "int64"
                         : t.scalar_type() == at::kInt  ? "int32"
                                                        : "";
      if (t.dim() < 1 || *dtype == '\0') return p;  // tensors the export does not describe: Kind::none
      inputs.push_back({.shape = std::vector<std::int64_t>(t.sizes().begin() + 1, t.sizes().end()), .dtype = dtype});
    }
    p.kind = InferencePipeline::Kind::tensors;
    p.inputs = std::move(inputs);
  }
  return p;
}

std::string to_json(const InferencePipeline& p) {
  json j{{"kind", name_of(p.kind)}, {"c", p.c}, {"vocab", p.vocab}, {"multi_label", p.multi_label}};
  if (p.image) j["image"] = image_to_json(*p.image);
  if (p.procs) {
    j["table"] = {{"procs", json::parse(p.procs->to_json())}, {"y_names", p.y_names}, {"regression", p.regression}};
    if (!p.table_layout.with_cont) j["table"]["with_cont"] = false;
    if (p.table_layout.known_categories_only) j["table"]["known_categories_only"] = true;
  }
  if (p.kind == InferencePipeline::Kind::tensors) {
    if (p.inputs.size() == 1 && p.inputs[0].dtype == "float32") {
      j["item_shape"] = p.inputs[0].shape;
    } else {
      j["inputs"] = json::array();
      for (const auto& input : p.inputs) j["inputs"].push_back({{"shape", input.shape}, {"dtype", input.dtype}});
    }
  }
  return j.dump();
}

InferencePipeline inference_pipeline_from_json(std::string_view text, const std::string& origin) {
  try {
    return from_json(json::parse(text), origin);
  } catch (const json::exception& e) {
    throw DataError(
        fmt::format("{}: the inference pipeline is not valid JSON: {}", excerpt(origin, 256), excerpt(e.what(), 256)));
  } catch (const DataError& e) {
    throw DataError(fmt::format("{}: inference pipeline: {}", excerpt(origin, 256), e.what()));
  }
}

DataLoaders inference_dataloaders(const InferencePipeline& p, const InferenceLoaderOptions& o) {
  DataLoaderOptions loader{.bs = o.bs, .num_workers = o.num_workers, .device = o.device};
  std::shared_ptr<const Dataset> items;
  switch (p.kind) {
    case InferencePipeline::Kind::images: {
      const auto& image = *p.image;
      items = std::make_shared<ImageDataset>(
          std::vector<std::filesystem::path>{}, at::Tensor(),
          ImageDatasetOptions{.mode = image.mode,
                              .item_tfm = resize(image.size, image.method, image.pad_mode),
                              .decode_min_side = image.decode_min_side});
      loader.batch_tfms = image_input_transforms(image.mean, image.std);
      break;
    }
    case InferencePipeline::Kind::table: {
      const auto n_cat = static_cast<std::int64_t>(p.procs->cat_names().size());
      const auto n_cont = static_cast<std::int64_t>(p.procs->cont_names().size());
      items = std::make_shared<TabularDataset>(
          TabularProcs::Encoded{torch::zeros({0, n_cat}, torch::kLong), torch::zeros({0, n_cont})}, at::Tensor(),
          p.procs, p.y_names, p.regression, p.table_layout);
      break;
    }
    case InferencePipeline::Kind::tensors: {
      std::vector<at::Tensor> none_yet;
      for (const auto& input : p.inputs) {
        std::vector<std::int64_t> shape{0};
        shape.insert(shape.end(), input.shape.begin(), input.shape.end());
        none_yet.push_back(torch::zeros(shape, input.dtype == "int64"   ? torch::kLong
                                               : input.dtype == "int32" ? torch::kInt
                                                                        : torch::kFloat));
      }
      items = std::make_shared<TensorDataset>(std::move(none_yet), std::vector<at::Tensor>{});
      break;
    }
    case InferencePipeline::Kind::none:  // a dataset of the user's own: new items come in the user's own loader
      items = std::make_shared<TensorDataset>(std::vector<at::Tensor>{torch::zeros({0})}, std::vector<at::Tensor>{});
      break;
  }
  auto dls = p.vocab.empty()
                 ? DataLoaders(DataLoader(items, loader), DataLoader(items, loader), p.c)
                 : DataLoaders(DataLoader(items, loader), DataLoader(items, loader), p.vocab, p.multi_label);
  if (p.image) dls.set_image_pipeline(std::make_shared<const ImagePipeline>(*p.image));
  return dls;
}

}  // namespace fastlearn
