#include <fastlearn/data/image_dataloaders.h>

#include <fastlearn/core/detail/text.h>
#include <fastlearn/core/detail/warning.h>
#include <fastlearn/core/error.h>
#include <fastlearn/data/csv.h>
#include <fastlearn/data/detail/model_input.h>
#include <fastlearn/data/idx.h>
#include <fastlearn/data/image_dataset.h>
#include <fastlearn/data/inference_pipeline.h>
#include <fastlearn/data/random_splitter.h>
#include <fastlearn/data/transforms.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/torch.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <fstream>
#include <iostream>
#include <map>
#include <regex>
#include <set>

namespace fastlearn {
namespace {

// Finds <dir>/<stem> or <dir>/<stem>.gz.
std::filesystem::path find_idx(const std::filesystem::path& dir, const std::string& stem) {
  for (const auto& name : {stem + ".gz", stem}) {
    if (std::filesystem::exists(dir / name)) return dir / name;
  }
  throw DataError(
      fmt::format("ImageDataLoaders::from_idx: '{}' has no {}[.gz]; an MNIST-format folder holds "
                  "train-images-idx3-ubyte, train-labels-idx1-ubyte, t10k-images-idx3-ubyte and "
                  "t10k-labels-idx1-ubyte (gzipped or raw)",
                  excerpt(dir.string(), 256), stem));
}

std::shared_ptr<TensorDataset> load_split(const std::filesystem::path& dir, const std::string& prefix) {
  auto images = read_idx(find_idx(dir, prefix + "-images-idx3-ubyte"));
  auto labels = read_idx(find_idx(dir, prefix + "-labels-idx1-ubyte"));
  if (images.dim() != 3 || labels.dim() != 1 || images.size(0) != labels.size(0)) {
    throw DataError(fmt::format("ImageDataLoaders::from_idx: '{}' {} images {} do not match labels {}",
                                excerpt(dir.string(), 256), prefix, fmt::join(images.sizes(), "x"),
                                fmt::join(labels.sizes(), "x")));
  }
  return std::make_shared<TensorDataset>(std::vector<at::Tensor>{images.unsqueeze(1)},
                                         std::vector<at::Tensor>{labels.to(torch::kLong)});
}

// The class names of an IDX folder: `given`, else <dir>/classes.txt (one per line; blank lines at the end and
// Windows line ends are fine), else none. Checked against the labels: every label has a name, no name is blank or
// repeated.
std::vector<std::string> idx_classes(const std::filesystem::path& dir, std::vector<std::string> given,
                                     std::int64_t max_label) {
  const auto file = dir / "classes.txt";
  std::string origin = "ImageDataLoaders::from_idx: options.classes";
  if (given.empty()) {
    if (!std::filesystem::exists(file)) return {};
    origin = excerpt(file.string(), 256);
    constexpr std::uintmax_t kMaxBytes = 1 << 20;
    std::error_code ec;
    const auto bytes = std::filesystem::file_size(file, ec);
    if (ec || bytes > kMaxBytes)
      throw DataError(fmt::format("{}: {}", origin,
                                  ec ? "cannot be read: " + ec.message()
                                     : fmt::format("{} bytes; a class list is at most {}", bytes, kMaxBytes)));
    std::ifstream in(file, std::ios::binary);
    for (std::string line; std::getline(in, line);) {
      if (line.ends_with('\r')) line.pop_back();
      given.push_back(line);
    }
    if (in.bad()) throw DataError(fmt::format("{}: read failed", origin));
    while (!given.empty() && given.back().empty()) given.pop_back();
  }
  std::set<std::string> seen;
  for (std::size_t i = 0; i < given.size(); ++i) {
    const auto& name = given[i];
    if (name.find_first_not_of(" \t") == std::string::npos)
      throw DataError(fmt::format("{}: class {} (line {}) has no name", origin, i, i + 1));
    if (!seen.insert(name).second)
      throw DataError(fmt::format("{}: class {} (line {}) repeats the name '{}'", origin, i, i + 1, excerpt(name)));
  }
  if (static_cast<std::int64_t>(given.size()) <= max_label)
    throw DataError(fmt::format("{}: names {} classes, but the labels go up to {}: name every class, in label order",
                                origin, given.size(), max_label));
  return given;
}

// Mean and standard deviation of all pixels scaled to [0, 1]. uint8 images (IDX files): from a 256-bin histogram,
// one pass over the bytes with exact integer counts (every rank of a job computes it before training starts, on its
// one thread); anything else in float64 chunks, to bound the memory used.
std::pair<double, double> pixel_statistics(const at::Tensor& images) {
  double sum = 0, sum_sq = 0;
  const auto n = images.numel();
  if (images.scalar_type() == torch::kByte) {
    const auto bytes = images.contiguous();
    const auto* p = bytes.data_ptr<std::uint8_t>();
    std::array<std::array<std::int64_t, 256>, 4> counts{};  // four, so that neighbouring bytes do not wait on one
    std::int64_t i = 0;
    for (; i + 4 <= n; i += 4) {
      ++counts[0][p[i]];
      ++counts[1][p[i + 1]];
      ++counts[2][p[i + 2]];
      ++counts[3][p[i + 3]];
    }
    for (; i < n; ++i) ++counts[0][p[i]];
    for (int v = 0; v < 256; ++v) {
      const double count = static_cast<double>(counts[0][v] + counts[1][v] + counts[2][v] + counts[3][v]);
      const double x = v / 255.0;
      sum += count * x;
      sum_sq += count * x * x;
    }
  } else {
    for (std::int64_t i = 0; i < images.size(0); i += 4096) {
      auto chunk = images.slice(0, i, i + 4096).to(torch::kFloat64).div_(255.0);
      sum += chunk.sum().item<double>();
      sum_sq += chunk.square().sum().item<double>();
    }
  }
  const double mean = n ? sum / n : 0.0;
  const double var = n > 1 ? (sum_sq - n * mean * mean) / (n - 1) : 0.0;
  return {mean, std::sqrt(std::max(var, 1e-12))};
}

}  // namespace

DataLoaders ImageDataLoaders::from_idx(const std::filesystem::path& dir, const ImageDataLoadersOptions& options) {
  auto train = load_split(dir, "train");
  auto valid = load_split(dir, "t10k");
  const auto& train_labels = train->targets().front();
  const auto& valid_labels = valid->targets().front();
  const std::int64_t max_label = std::max(train_labels.numel() ? train_labels.max().item<std::int64_t>() : -1,
                                          valid_labels.numel() ? valid_labels.max().item<std::int64_t>() : -1);
  auto classes = idx_classes(dir, options.classes, max_label);
  const std::int64_t c = classes.empty() ? max_label + 1 : static_cast<std::int64_t>(classes.size());

  // New image files for this data: grey, squished to the training images' side, normalized as they are.
  const auto& images = train->inputs().front();
  auto pipeline = std::make_shared<ImagePipeline>(
      ImagePipeline{.mode = ImageMode::gray,
                    .size = images.dim() == 4 ? ImageSize{images.size(2), images.size(3)} : ImageSize{28, 28},
                    .method = ResizeMethod::squish});
  if (options.normalize) {
    const auto [mean, std] = pixel_statistics(images);
    pipeline->mean = {mean};
    pipeline->std = {std};
  }
  const auto common = image_input_transforms(pipeline->mean, pipeline->std);
  DataLoaderOptions train_options{.bs = options.bs,
                                  .shuffle = true,
                                  .drop_last = true,
                                  .num_workers = options.num_workers,
                                  .seed = options.seed,
                                  .batch_tfms = common,
                                  .device = options.device};
  if (options.augment) {
    const auto side = train->inputs().front().size(2);
    std::vector<BatchTransform> augment;
    if (options.crop_padding > 0) augment.push_back(random_crop(side, options.crop_padding));
    if (options.flip_p > 0) augment.push_back(random_flip(options.flip_p));
    train_options.batch_tfms.insert(train_options.batch_tfms.begin(), augment.begin(), augment.end());
  }
  DataLoaderOptions valid_options{.bs = options.valid_bs > 0 ? options.valid_bs : 2 * options.bs,
                                  .num_workers = options.num_workers,
                                  .seed = options.seed,
                                  .batch_tfms = common,
                                  .device = options.device};
  DataLoaders dls = classes.empty() ? DataLoaders(DataLoader(train, train_options), DataLoader(valid, valid_options), c)
                                    : DataLoaders(DataLoader(train, train_options), DataLoader(valid, valid_options),
                                                  std::move(classes));
  dls.set_image_pipeline(std::move(pipeline));
  return dls;
}

namespace {

namespace fs = std::filesystem;
using Labels = std::vector<std::string>;  // the labels of one item (one, or any number for multi-label)

struct Items {
  std::vector<fs::path> files;
  std::vector<Labels> labels;
};

// Leaves out the files that do not decode, with one warning that counts and names them.
void drop_bad_images(Items& items, const char* split) {
  const auto bad_files = skipped_bad_images(items.files, fmt::format("{} image(s)", split));
  if (bad_files.empty()) return;
  Items kept;
  for (std::size_t i = 0; i < items.files.size(); ++i) {
    if (bad_files.contains(items.files[i])) continue;
    kept.files.push_back(items.files[i]);
    kept.labels.push_back(items.labels[i]);
  }
  items = std::move(kept);
}

at::Tensor targets_of(const Items& items, const std::map<std::string, std::int64_t>& index, bool multi_label) {
  const auto n = static_cast<std::int64_t>(items.files.size());
  if (multi_label) {
    auto targets = torch::zeros({n, static_cast<std::int64_t>(index.size())}, torch::kFloat32);
    auto rows = targets.accessor<float, 2>();
    for (std::int64_t i = 0; i < n; ++i) {
      for (const auto& label : items.labels[static_cast<std::size_t>(i)]) rows[i][index.at(label)] = 1.0F;
    }
    return targets;
  }
  auto targets = torch::empty({n}, torch::kLong);
  auto* out = targets.data_ptr<std::int64_t>();
  for (std::int64_t i = 0; i < n; ++i) out[i] = index.at(items.labels[static_cast<std::size_t>(i)].front());
  return targets;
}

DataLoaders build(Items train, Items valid, bool multi_label, ImageFilesOptions options, const char* origin) {
  if (options.item_size) {
    if (options.item_size->height != options.item_size->width) {
      throw DataError(fmt::format(
          "{}: item_size {}x{} is not square; classification items are square for now (the export records one "
          "side): use size",
          excerpt(origin, 256), options.item_size->height, options.item_size->width));
    }
    options.size = options.item_size->height;
  }
  if (options.size < 1)
    throw DataError(fmt::format("{}: size {} must be positive", excerpt(origin, 256), options.size));
  if (options.skip_bad_images) {
    drop_bad_images(train, "training");
    drop_bad_images(valid, "validation");
  }
  if (train.files.empty()) throw DataError(fmt::format("{}: no training images", excerpt(origin, 256)));
  if (valid.files.empty()) throw DataError(fmt::format("{}: no validation images", excerpt(origin, 256)));
  std::set<std::string> names, valid_only;
  for (const auto& labels : train.labels) names.insert(labels.begin(), labels.end());
  for (const auto& labels : valid.labels)
    for (const auto& label : labels)
      if (!names.contains(label)) valid_only.insert(label);
  // Kept in the vocabulary (the validation targets need an index), but no training image teaches them.
  if (!valid_only.empty())
    warn(
        fmt::format("{}: {} class(es) have validation images but no training image, so the model cannot learn them: {}",
                    excerpt(origin, 256), valid_only.size(),
                    fmt::join(excerpts(std::vector<std::string>(valid_only.begin(), valid_only.end())), ", ")));
  names.insert(valid_only.begin(), valid_only.end());
  if (names.size() == 1 && !multi_label)
    warn(
        fmt::format("{}: every image has the label '{}': with one class every prediction is right, and the model "
                    "learns nothing",
                    excerpt(origin, 256), excerpt(*names.begin())));
  std::vector<std::string> vocab(names.begin(), names.end());
  std::map<std::string, std::int64_t> index;
  for (std::size_t i = 0; i < vocab.size(); ++i) index[vocab[i]] = static_cast<std::int64_t>(i);

  const auto valid_tfm = resize(options.size, options.method, options.pad_mode);
  const auto train_tfm =
      options.min_scale < 1.0 ? random_resized_crop(options.size, {.min_scale = options.min_scale}) : valid_tfm;
  auto train_ds = std::make_shared<ImageDataset>(
      std::move(train.files), targets_of(train, index, multi_label),
      ImageDatasetOptions{
          .mode = options.mode, .item_tfm = train_tfm, .decode_min_side = options.size, .random = true});
  auto valid_ds = std::make_shared<ImageDataset>(
      std::move(valid.files), targets_of(valid, index, multi_label),
      ImageDatasetOptions{.mode = options.mode, .item_tfm = valid_tfm, .decode_min_side = options.size});

  ChannelStatistics stats;
  if (options.normalize == ImageNormalization::computed) {
    stats = channel_statistics(*train_ds, options.stats_items, options.split_seed);
    for (auto& s : stats.std) s = std::max(s, 1e-7);  // a channel of one colour: leave it centred, not infinite
  }
  auto [train_dl, valid_dl] = image_loaders(train_ds, valid_ds, options, stats, /*masks=*/false);
  DataLoaders dls(std::move(train_dl), std::move(valid_dl), std::move(vocab), multi_label);
  auto [mean, std] = model_input_mean_std(options, stats);
  dls.set_image_pipeline(std::make_shared<ImagePipeline>(ImagePipeline{.mode = options.mode,
                                                                       .size = {options.size, options.size},
                                                                       .method = options.method,
                                                                       .pad_mode = options.pad_mode,
                                                                       .decode_min_side = options.size,
                                                                       .mean = std::move(mean),
                                                                       .std = std::move(std)}));
  return dls;
}

// The seeded valid_pct split (fastai's RandomSplitter). Both parts keep the items' order.
std::pair<Items, Items> random_split(Items all, double valid_pct, std::uint64_t seed, const char* origin) {
  const auto is_valid = random_valid_mask(static_cast<std::int64_t>(all.files.size()), valid_pct, seed, origin);
  Items train, valid;
  for (std::size_t i = 0; i < all.files.size(); ++i) {
    auto& part = is_valid[i] ? valid : train;
    part.files.push_back(std::move(all.files[i]));
    part.labels.push_back(std::move(all.labels[i]));
  }
  return {std::move(train), std::move(valid)};
}

// The label of an image is its class folder: the folder right under `dir` that holds it, however deep (as
// torchvision's ImageFolder has it; the innermost folder's name would merge the subfolders of all classes).
Items labelled_by_class_folder(const fs::path& dir) {
  Items items;
  std::vector<std::string> outside;  // images right in `dir`, in no class folder
  for (auto& file : get_image_files(dir)) {
    const auto relative = file.lexically_relative(dir);
    if (std::next(relative.begin()) == relative.end()) {
      outside.push_back(relative.string());
      continue;
    }
    auto label = relative.begin()->string();
    require_utf8(label,
                 fmt::format("the class folder '{}' of '{}': its name", excerpt(label), excerpt(dir.string(), 256)),
                 "rename the folder");
    items.labels.push_back({std::move(label)});
    items.files.push_back(std::move(file));
  }
  if (!outside.empty())
    warn(fmt::format(
        "'{}': {} image(s) outside any class folder left out: {}{}", excerpt(dir.string(), 256), outside.size(),
        fmt::join(excerpts(std::vector<std::string>(outside.begin(),
                                                    outside.begin() + std::min<std::size_t>(outside.size(), 5)),
                           256),
                  ", "),
        outside.size() > 5 ? ", ..." : ""));
  if (items.files.empty())
    throw DataError(
        fmt::format("no .jpg, .jpeg or .png files in class folders under '{}'", excerpt(dir.string(), 256)));
  // A class folder without an image is no class at all: say so rather than leave it out in silence.
  std::set<std::string> holding;
  for (const auto& file : items.files) holding.insert(file.lexically_relative(dir).begin()->string());
  std::vector<std::string> empty;
  for (const auto& entry : fs::directory_iterator(dir))
    if (entry.is_directory() && !holding.contains(entry.path().filename().string()))
      empty.push_back(entry.path().filename().string());
  std::sort(empty.begin(), empty.end());
  if (!empty.empty())
    warn(fmt::format("'{}': {} folder(s) without a .jpg, .jpeg or .png image left out: {}", excerpt(dir.string(), 256),
                     empty.size(), fmt::join(excerpts(empty), ", ")));
  return items;
}

bool parse_flag(const std::string& text, const std::string& origin, std::size_t row, const std::string& column) {
  if (const auto flag = csv_flag(text)) return *flag;
  throw DataError(fmt::format("{}: row {}: column '{}' holds '{}', not {}", excerpt(origin, 256), row, excerpt(column),
                              excerpt(text), kCsvFlagValues));
}

}  // namespace

DataLoader ImageDataLoaders::test_dl(const DataLoaders& dls, std::vector<fs::path> files) {
  const auto* valid = dynamic_cast<const ImageDataset*>(&dls.valid().dataset());
  const auto* pipeline = dls.image_pipeline();
  if (valid == nullptr && pipeline == nullptr) {
    throw DataError(
        "test_dl: the data's validation set is not images (ImageDataLoaders::from_folder, from_lists, "
        "from_name_re, from_name_func, from_csv or from_idx make one)");
  }
  if (files.empty()) throw DataError("test_dl: no files");
  auto options = dls.valid().options();
  options.shuffle = false;
  options.drop_last = false;
  // Image files for data held as tensors (from_idx): decoded and resized as its pipeline says.
  const auto items = valid
                         ? valid->options()
                         : ImageDatasetOptions{.mode = pipeline->mode,
                                               .item_tfm = resize(pipeline->size, pipeline->method, pipeline->pad_mode),
                                               .decode_min_side = pipeline->decode_min_side};
  return DataLoader(std::make_shared<ImageDataset>(std::move(files), at::Tensor(), items), std::move(options));
}

DataLoaders ImageDataLoaders::from_folder(const fs::path& path, const ImageFilesOptions& options,
                                          const std::string& train, const std::string& valid) {
  if (fs::is_directory(path / train)) {
    if (!fs::is_directory(path / valid)) {
      throw DataError(fmt::format("ImageDataLoaders::from_folder: '{}' has a '{}' folder but no '{}' folder",
                                  excerpt(path.string(), 256), excerpt(train), excerpt(valid)));
    }
    return build(labelled_by_class_folder(path / train), labelled_by_class_folder(path / valid), false, options,
                 "ImageDataLoaders::from_folder");
  }
  auto [train_items, valid_items] = random_split(labelled_by_class_folder(path), options.valid_pct, options.split_seed,
                                                 "ImageDataLoaders::from_folder");
  return build(std::move(train_items), std::move(valid_items), false, options, "ImageDataLoaders::from_folder");
}

DataLoaders ImageDataLoaders::from_lists(std::vector<fs::path> files, std::vector<std::string> labels,
                                         const ImageFilesOptions& options) {
  if (files.size() != labels.size()) {
    throw DataError(fmt::format("ImageDataLoaders::from_lists: {} files but {} labels", files.size(), labels.size()));
  }
  Items all{std::move(files), {}};
  for (auto& label : labels) all.labels.push_back({std::move(label)});
  auto [train, valid] =
      random_split(std::move(all), options.valid_pct, options.split_seed, "ImageDataLoaders::from_lists");
  return build(std::move(train), std::move(valid), false, options, "ImageDataLoaders::from_lists");
}

DataLoaders ImageDataLoaders::from_name_func(std::vector<fs::path> files,
                                             const std::function<std::string(const fs::path&)>& label_of,
                                             const ImageFilesOptions& options) {
  std::vector<std::string> labels;
  labels.reserve(files.size());
  for (const auto& file : files) labels.push_back(label_of(file));
  return from_lists(std::move(files), std::move(labels), options);
}

DataLoaders ImageDataLoaders::from_name_re(std::vector<fs::path> files, const std::string& pattern,
                                           const ImageFilesOptions& options) {
  std::regex re;
  try {
    re = std::regex(pattern);
  } catch (const std::regex_error& e) {
    throw DataError(fmt::format("ImageDataLoaders::from_name_re: pattern '{}' is not a regular expression: {}",
                                excerpt(pattern), e.what()));
  }
  if (re.mark_count() < 1) {
    throw DataError(fmt::format("ImageDataLoaders::from_name_re: pattern '{}' has no capture group for the label",
                                excerpt(pattern)));
  }
  return from_name_func(
      std::move(files),
      [&](const fs::path& file) {
        const auto name = file.filename().string();
        std::smatch match;
        if (!std::regex_match(name, match, re)) {
          throw DataError(fmt::format("ImageDataLoaders::from_name_re: '{}' does not match '{}'",
                                      excerpt(file.string(), 256), excerpt(pattern)));
        }
        return match[1].str();
      },
      options);
}

DataLoaders ImageDataLoaders::from_csv(const fs::path& csv_file, const ImageCsvColumns& columns,
                                       const ImageFilesOptions& options) {
  const auto table = read_csv(csv_file, {.delimiter = columns.delimiter});
  const std::string origin = csv_file.string();
  if (table.columns.size() < 2 && (columns.fn_col.empty() || columns.label_col.empty())) {
    throw DataError(fmt::format("{}: needs a file name and a label column, has {} column(s)", excerpt(origin, 256),
                                table.columns.size()));
  }
  const auto fn = columns.fn_col.empty() ? 0 : table.column(columns.fn_col, origin);
  const auto label = columns.label_col.empty() ? 1 : table.column(columns.label_col, origin);
  const bool has_valid_col = !columns.valid_col.empty();
  const std::size_t valid_col = has_valid_col ? table.column(columns.valid_col, origin) : 0;
  const auto root = csv_file.parent_path() / columns.folder;
  const bool multi_label = !columns.label_delim.empty();
  Items all, train, valid;
  for (std::size_t r = 0; r < table.rows.size(); ++r) {
    const auto& row = table.rows[r];
    Labels labels;
    if (multi_label) {
      std::size_t start = 0;
      for (;;) {
        const auto end = row[label].find(columns.label_delim, start);
        auto piece = row[label].substr(start, end == std::string::npos ? std::string::npos : end - start);
        if (!piece.empty()) labels.push_back(std::move(piece));
        if (end == std::string::npos) break;
        start = end + columns.label_delim.size();
      }
    } else {
      if (row[label].empty())
        throw DataError(fmt::format("{}: row {} has an empty label", excerpt(origin, 256), r + 2));
      labels.push_back(row[label]);
    }
    auto& part = !has_valid_col ? all : parse_flag(row[valid_col], origin, r + 2, columns.valid_col) ? valid : train;
    auto file = root / (row[fn] + columns.suffix);
    // Checked here, a stat per row: found only when a loader reached it, a missing file stopped a run mid-epoch.
    std::error_code error;
    if (const auto status = fs::status(file, error); status.type() != fs::file_type::regular) {
      const auto why = status.type() == fs::file_type::not_found ? std::string("does not exist")
                       : error                                   ? "cannot be read: " + error.message()
                                                                 : std::string("is not a file");
      throw DataError(fmt::format("{}: row {} names '{}', which {}", excerpt(origin, 256), r + 2,
                                  excerpt(file.string(), 256), why));
    }
    part.files.push_back(std::move(file));
    part.labels.push_back(std::move(labels));
  }
  if (!has_valid_col)
    std::tie(train, valid) = random_split(std::move(all), options.valid_pct, options.split_seed, origin.c_str());
  return build(std::move(train), std::move(valid), multi_label, options, origin.c_str());
}

}  // namespace fastlearn
