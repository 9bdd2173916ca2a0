#include <fastlearn/data/image_dataset.h>

#include <fastlearn/core/detail/parallel.h>
#include <fastlearn/core/detail/text.h>
#include <fastlearn/core/detail/warning.h>
#include <fastlearn/core/error.h>
#include <fastlearn/data/detail/buffer_pool.h>
#include <fastlearn/data/detail/file_threads.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/torch.h>

#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>

namespace fastlearn {

ImageDataset::ImageDataset(std::vector<std::filesystem::path> files, at::Tensor targets, ImageDatasetOptions options)
    : files_(std::move(files)), targets_(std::move(targets)), options_(std::move(options)) {
  if (targets_.defined() && (targets_.dim() < 1 || targets_.size(0) != static_cast<std::int64_t>(files_.size()))) {
    throw DataError(fmt::format("ImageDataset: {} files but targets shaped [{}]; give one target per file",
                                files_.size(), fmt::join(targets_.sizes(), ", ")));
  }
}

at::Tensor ImageDataset::load_image(std::int64_t index, at::Generator* rng) const {
  if (index < 0 || index >= size()) {
    throw DataError(fmt::format("ImageDataset: index {} is outside [0, {})", index, size()));
  }
  const auto& file = files_[static_cast<std::size_t>(index)];
  const DecodeOptions decode{.mode = options_.mode, .min_side = options_.decode_min_side};
  if (!options_.item_tfm) return read_image(file, decode);
  // The item transform makes new memory, so the decoded pixels can live in this thread's scratch.
  thread_local DecodeScratch scratch;
  auto image = read_image_into(scratch, file, decode);
  try {
    auto item = options_.item_tfm(image, options_.random ? rng : nullptr);
    // A transform that hands back (a view of) its input would hand back memory the next image overwrites.
    return item.is_alias_of(image) ? item.clone() : item;
  } catch (const DataError& e) {
    throw DataError(fmt::format("{}: {}", excerpt(file.string(), 256), e.what()));
  }
}

Batch ImageDataset::load(std::span<const std::int64_t> indices, at::Generator* rng) const {
  at::Tensor images;  // (N, C, H, W), in the loader's batch memory; each image is copied in as it is made
  for (std::size_t k = 0; k < indices.size(); ++k) {
    auto image = load_image(indices[k], rng);
    if (k == 0) {
      std::vector<std::int64_t> shape{static_cast<std::int64_t>(indices.size())};
      shape.insert(shape.end(), image.sizes().begin(), image.sizes().end());
      images = pooled_empty(shape, image.options());
    } else if (image.sizes() != images.sizes().slice(1)) {
      throw DataError(fmt::format(
          "ImageDataset: '{}' comes out [{}] but '{}' [{}]; give an item transform "
          "(resize) that makes every image the same size",
          excerpt(files_[static_cast<std::size_t>(indices[k])].string(), 256), fmt::join(image.sizes(), ", "),
          excerpt(files_[static_cast<std::size_t>(indices.front())].string(), 256),
          fmt::join(images.sizes().slice(1), ", ")));
    }
    images[static_cast<std::int64_t>(k)].copy_(image);
  }
  if (!images.defined()) images = torch::empty({0}, torch::kUInt8);
  if (!targets_.defined()) return {{images}, {}};
  auto index = torch::tensor(std::vector<std::int64_t>(indices.begin(), indices.end()), torch::kLong);
  return {{images}, {targets_.index_select(0, index)}};
}

Item ImageDataset::get(std::int64_t index) const {
  if (!targets_.defined()) return {{load_image(index, nullptr)}, {}};
  return {{load_image(index, nullptr)}, {targets_[index]}};
}

Batch ImageDataset::get_batch(std::span<const std::int64_t> indices) const { return load(indices, nullptr); }

Batch ImageDataset::load_batch(std::span<const std::int64_t> indices, at::Generator& rng) const {
  return load(indices, &rng);
}

std::vector<std::filesystem::path> get_image_files(const std::filesystem::path& dir) {
  namespace fs = std::filesystem;
  std::error_code error;
  if (!fs::is_directory(dir, error)) {
    throw DataError(fmt::format("'{}' is not a folder of images{}", excerpt(dir.string(), 256),
                                error ? ": " + error.message() : std::string()));
  }
  std::vector<fs::path> files;
  auto it = fs::recursive_directory_iterator(dir, fs::directory_options::none, error);
  if (error) throw DataError(fmt::format("cannot list '{}': {}", excerpt(dir.string(), 256), error.message()));
  for (const auto& end = fs::recursive_directory_iterator(); it != end; it.increment(error)) {
    if (error) throw DataError(fmt::format("cannot list '{}': {}", excerpt(dir.string(), 256), error.message()));
    if (!it->is_regular_file(error)) continue;
    auto ext = it->path().extension().string();
    std::transform(ext.begin(), ext.end(), ext.begin(), [](unsigned char c) { return std::tolower(c); });
    if (ext == ".jpg" || ext == ".jpeg" || ext == ".png") files.push_back(it->path());
  }
  std::sort(files.begin(), files.end());
  return files;
}

ChannelStatistics channel_statistics(const ImageDataset& dataset, std::int64_t max_items, std::uint64_t seed,
                                     int threads) {
  const auto n = dataset.size();
  if (n == 0) throw DataError("channel_statistics: the dataset has no images");
  auto order = torch::arange(n, torch::kLong);
  if (max_items > 0 && max_items < n) {
    auto rng = at::make_generator<at::CPUGeneratorImpl>(seed);
    order = torch::randperm(n, rng, torch::kLong).narrow(0, 0, max_items);
  }
  const auto* items = order.data_ptr<std::int64_t>();
  // Sums in float64 per item, added up in item order: the result does not depend on the thread count.
  std::vector<at::Tensor> sums(static_cast<std::size_t>(order.numel())), squares(sums.size());
  std::vector<std::int64_t> counts(sums.size());
  std::vector<std::exception_ptr> errors(sums.size());
  for_each_file(sums.size(), threads, [&](std::size_t k) {
    try {
      auto pixels = dataset.load_image(items[k], nullptr).to(torch::kFloat64).div_(255).flatten(1);
      sums[k] = pixels.sum(1);
      squares[k] = pixels.square().sum(1);
      counts[k] = pixels.size(1);
    } catch (...) {
      errors[k] = std::current_exception();
    }
  });
  for (const auto& error : errors)
    if (error) std::rethrow_exception(error);
  std::int64_t pixels_per_channel = 0;
  at::Tensor sum = torch::zeros_like(sums.front()), square = torch::zeros_like(squares.front());
  for (std::size_t k = 0; k < sums.size(); ++k) {
    sum += sums[k];
    square += squares[k];
    pixels_per_channel += counts[k];
  }
  auto mean = sum / static_cast<double>(pixels_per_channel);
  auto std = (square / static_cast<double>(pixels_per_channel) - mean.square()).clamp_min(0).sqrt();
  auto values = [](const at::Tensor& t) {
    return std::vector<double>(t.data_ptr<double>(), t.data_ptr<double>() + t.numel());
  };
  return {values(mean), values(std)};
}

std::vector<BadImage> verify_images(const std::vector<std::filesystem::path>& files, int threads) {
  std::vector<std::string> errors(files.size());
  for_each_file(files.size(), threads, [&](std::size_t i) {
    try {
      // Decoding at 1/8 scale checks the whole JPEG stream at a fraction of the cost.
      read_image(files[i], {.min_side = 1});
    } catch (const std::exception& e) {
      errors[i] = e.what();
      if (errors[i].empty()) errors[i] = "unknown error";
    }
  });
  std::vector<BadImage> bad;
  for (std::size_t i = 0; i < files.size(); ++i) {
    if (!errors[i].empty()) bad.push_back({files[i], errors[i]});
  }
  return bad;
}

std::vector<BadImage> verify_images(const std::filesystem::path& dir, int threads) {
  return verify_images(get_image_files(dir), threads);
}

std::set<std::filesystem::path> skipped_bad_images(const std::vector<std::filesystem::path>& files,
                                                   std::string_view what) {
  const auto bad = verify_images(files);
  std::set<std::filesystem::path> bad_files;
  std::vector<std::string> named;
  for (const auto& b : bad) {
    bad_files.insert(b.file);
    if (named.size() < 10) named.push_back(fmt::format("{} ({})", excerpt(b.file.string(), 256), b.error));
  }
  if (!bad.empty()) {
    warn(fmt::format("skipping {} {} that do not decode: {}{}", bad.size(), what, fmt::join(named, "; "),
                     bad.size() > named.size() ? "; ..." : ""));
  }
  return bad_files;
}

}  // namespace fastlearn
