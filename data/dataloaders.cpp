#include <fastlearn/data/dataloaders.h>

#include <fastlearn/core/error.h>
#include <fastlearn/data/idx.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/torch.h>

namespace fastlearn {

DataLoaders::DataLoaders(DataLoader train, DataLoader valid, std::int64_t c)
    : train_(std::move(train)), valid_(std::move(valid)), c_(c) {}

void DataLoaders::to(const c10::Device& device) {
  train_.set_device(device);
  valid_.set_device(device);
}

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
                  dir.string(), stem));
}

std::shared_ptr<TensorDataset> load_split(const std::filesystem::path& dir, const std::string& prefix) {
  auto images = read_idx(find_idx(dir, prefix + "-images-idx3-ubyte"));
  auto labels = read_idx(find_idx(dir, prefix + "-labels-idx1-ubyte"));
  if (images.dim() != 3 || labels.dim() != 1 || images.size(0) != labels.size(0)) {
    throw DataError(fmt::format("ImageDataLoaders::from_idx: '{}' {} images {} do not match labels {}", dir.string(),
                                prefix, fmt::join(images.sizes(), "x"), fmt::join(labels.sizes(), "x")));
  }
  return std::make_shared<TensorDataset>(std::vector<at::Tensor>{images.unsqueeze(1)},
                                         std::vector<at::Tensor>{labels.to(torch::kLong)});
}

// Mean and standard deviation of all pixels scaled to [0, 1], in chunks to bound the memory used.
std::pair<double, double> pixel_statistics(const at::Tensor& images) {
  double sum = 0, sum_sq = 0;
  const auto n = images.numel();
  for (std::int64_t i = 0; i < images.size(0); i += 4096) {
    auto chunk = images.slice(0, i, i + 4096).to(torch::kFloat64).div_(255.0);
    sum += chunk.sum().item<double>();
    sum_sq += chunk.square().sum().item<double>();
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
  const std::int64_t c = train_labels.numel() ? train_labels.max().item<std::int64_t>() + 1 : 0;

  std::vector<BatchTransform> common{to_float(1.0 / 255.0)};
  if (options.normalize) {
    const auto [mean, std] = pixel_statistics(train->inputs().front());
    common.push_back(normalize({mean}, {std}));
  }
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
  return DataLoaders(DataLoader(train, train_options), DataLoader(valid, valid_options), c);
}

}  // namespace fastlearn
