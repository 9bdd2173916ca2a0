#include <fastlearn/config/data_from_config.h>

#include <fastlearn/comm/runtime.h>
#include <fastlearn/core/detail/text.h>
#include <fastlearn/data/collab_dataloaders.h>
#include <fastlearn/data/csv.h>
#include <fastlearn/data/dataset.h>
#include <fastlearn/data/image_dataloaders.h>
#include <fastlearn/data/image_dataset.h>
#include <fastlearn/data/inference_pipeline.h>
#include <fastlearn/data/segmentation_dataloaders.h>
#include <fastlearn/data/untar_data.h>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <filesystem>

namespace fastlearn {

namespace fs = std::filesystem;

namespace {

// A running program hands the samples over (the step API, the C interface): loaders without items that describe them
// (an export records the input shape; the model's outputs are the target's values).
DataLoaders program_samples(const DataConfig& d) {
  std::int64_t outputs = 1;
  const auto targets = program_targets(d);
  for (const auto n : targets.front().shape) outputs *= n;
  if (d.classes > 0) outputs = d.classes;  // a score per class
  std::vector<TensorInput> inputs;
  for (const auto& input : program_inputs(d)) inputs.push_back({.shape = input.shape, .dtype = input.dtype});
  return inference_dataloaders({.kind = InferencePipeline::Kind::tensors, .inputs = std::move(inputs), .c = outputs},
                               {.bs = d.bs, .num_workers = static_cast<int>(d.workers)});
}

// y = x . w + b + noise with x ~ N(0, 1); w, b and the noise all drawn from the seed.
DataLoaders synthetic_regression(const DataConfig& d) {
  const auto& s = d.synthetic;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(static_cast<std::uint64_t>(s.seed));
  const auto w = at::randn({s.features, 1}, gen);
  const auto b = at::randn({1}, gen);
  auto make = [&](std::int64_t n) {
    auto x = at::randn({n, s.features}, gen);
    auto y = x.mm(w) + b + s.noise * at::randn({n, 1}, gen);
    return std::make_shared<TensorDataset>(std::vector<at::Tensor>{x}, std::vector<at::Tensor>{y});
  };
  auto train = make(s.n_train);
  auto valid = make(s.n_valid);
  return DataLoaders(
      DataLoader(train, {.bs = d.bs, .shuffle = true, .num_workers = static_cast<int>(d.workers)}),
      DataLoader(valid, {.bs = d.valid_bs > 0 ? d.valid_bs : 2 * d.bs, .num_workers = static_cast<int>(d.workers)}), 1);
}

ImageFilesOptions image_files_options(const TrainConfig& c) {
  const auto& d = c.data;
  const auto& t = d.transforms;
  return {
      .bs = d.bs,
      .valid_bs = d.valid_bs,
      .num_workers = static_cast<int>(d.workers),
      .seed = static_cast<std::uint64_t>(c.train.seed),
      .size = d.size,
      .item_size = d.item_size.size() == 2 ? std::optional(ImageSize{d.item_size[0], d.item_size[1]}) : std::nullopt,
      .method = resize_method(t.resize),
      .pad_mode = pad_mode(t.pad_mode),
      .min_scale = t.min_scale,
      .flip_p = t.random_flip,
      .normalize = !t.normalize            ? ImageNormalization::none
                   : t.stats == "computed" ? ImageNormalization::computed
                                           : ImageNormalization::imagenet,
      .skip_bad_images = d.skip_bad_images,
      .valid_pct = d.valid_pct,
      .split_seed = static_cast<std::uint64_t>(c.train.seed),
      .augment = t.augment ? std::optional(AugOptions{}) : std::nullopt};
}

// Images and their masks: data.images and data.masks under data.path, paired by path or by data.mask_name.
DataLoaders segmentation_files(const TrainConfig& c) {
  const auto& d = c.data;
  const auto images = fs::path(d.path) / d.images, masks = fs::path(d.path) / d.masks;
  for (const auto& [key, dir] : {std::pair{"data.images", images}, std::pair{"data.masks", masks}})
    if (!fs::is_directory(dir))
      throw DataError(fmt::format("{}: '{}' is not a folder", key, excerpt(dir.string(), 256)));
  const auto options = image_files_options(c);
  if (d.mask_name.empty()) return SegmentationDataLoaders::from_folders(images, masks, d.codes, options);
  const auto pattern = d.mask_name;
  const auto mask_of = [&](const fs::path& image) {
    auto name = pattern;
    name.replace(name.find("{stem}"), 6, image.stem().string());
    return masks / image.parent_path().lexically_relative(images) / name;
  };
  return SegmentationDataLoaders::from_label_func(get_image_files(images), mask_of, d.codes, options);
}

// The user's image files: class folders, or a CSV table of file names and labels.
DataLoaders image_files(const TrainConfig& c) {
  const auto& d = c.data;
  const auto options = image_files_options(c);
  if (d.dataset == "image_csv") {
    return ImageDataLoaders::from_csv(fs::path(d.path) / d.csv,
                                      {.fn_col = d.fn_col,
                                       .label_col = d.label_col,
                                       .valid_col = d.valid_col,
                                       .label_delim = d.label_delim,
                                       .delimiter = d.delimiter.front()},
                                      options);
  }
  return ImageDataLoaders::from_folder(d.path, options);
}

// Fashion-MNIST's IDX files: data.path, or the archive at data.url (default: Debian's copy), fetched once per host.
DataLoaders idx_images(const TrainConfig& c) {
  const auto& d = c.data;
  fs::path dir = d.path;
  if (dir.empty())
    dir = rank0_first([&] { return d.url.empty() ? untar_data(urls::fashion_mnist()) : untar_data(d.url); });
  const auto& t = d.transforms;
  return ImageDataLoaders::from_idx(dir, {.bs = d.bs,
                                          .valid_bs = d.valid_bs,
                                          .num_workers = static_cast<int>(d.workers),
                                          .seed = static_cast<std::uint64_t>(c.train.seed),
                                          .normalize = t.normalize,
                                          .augment = t.random_crop_padding > 0 || t.random_flip > 0,
                                          .crop_padding = t.random_crop_padding,
                                          .flip_p = t.random_flip});
}

}  // namespace

TabularOptions tabular_options(const TrainConfig& c) {
  const auto& d = c.data;
  return {.y_names = d.y_names,
          .cat_names = d.cat_names,
          .cont_names = d.cont_names,
          .procs = d.procs,
          .regression = d.y_block.empty() ? std::nullopt : std::optional(d.y_block == "regression"),
          .valid_col = d.valid_col,
          .valid_pct = d.valid_pct,
          .split_seed = static_cast<std::uint64_t>(c.train.seed),
          .bs = d.bs,
          .valid_bs = d.valid_bs,
          .num_workers = static_cast<int>(d.workers),
          .seed = static_cast<std::uint64_t>(c.train.seed),
          .delimiter = d.delimiter.front()};
}

// Declared with load_config (train_config.h), whose default probe it is; it reads the data as the builders here do.
std::optional<bool> regression_of_data(const TrainConfig& c) {
  if (!fs::is_regular_file(c.data.path)) return std::nullopt;  // the command says what is wrong with data.path
  const auto table = read_csv(c.data.path, {.delimiter = c.data.delimiter.front()});
  return TabularDataLoaders::regression(table, tabular_options(c), c.data.path);
}

namespace {

DataLoaders read_data(const TrainConfig& c) {
  const auto& dataset = c.data.dataset;
  if (dataset == "synthetic_regression") return synthetic_regression(c.data);
  if (dataset == "program") return program_samples(c.data);
  if (dataset == "csv") return TabularDataLoaders::from_csv(c.data.path, tabular_options(c));
  if (dataset == "ratings") {
    const auto& d = c.data;
    return CollabDataLoaders::from_csv(d.path, {.user = d.user,
                                                .item = d.item,
                                                .rating = d.rating,
                                                .valid_pct = d.valid_pct,
                                                .seed = static_cast<std::uint64_t>(c.train.seed),
                                                .bs = d.bs,
                                                .valid_bs = d.valid_bs,
                                                .num_workers = static_cast<int>(d.workers),
                                                .shuffle_seed = static_cast<std::uint64_t>(c.train.seed),
                                                .delimiter = d.delimiter.front()});
  }
  if (dataset == "segmentation") return segmentation_files(c);
  if (dataset == "image_folder" || dataset == "image_csv") return image_files(c);
  if (dataset == "fashion_mnist") return idx_images(c);
  throw ConfigError(fmt::format("data.dataset: unknown dataset \"{}\"; expected one of \"{}\"", excerpt(dataset),
                                fmt::join(dataset_names(), "\", \"")));
}

}  // namespace

DataLoaders dataloaders_from_config(const TrainConfig& c) {
  auto dls = read_data(c);
  // A model's factory may read the first item (the mlp's width): nothing to train on is said here, by name.
  if (dls.train().dataset().size() == 0 && c.data.dataset != "program")
    throw DataError(fmt::format("data.dataset = \"{}\"{}: the training split has no items", c.data.dataset,
                                c.data.path.empty() ? "" : fmt::format(" at '{}'", excerpt(c.data.path, 256))));
  return dls;
}

}  // namespace fastlearn
