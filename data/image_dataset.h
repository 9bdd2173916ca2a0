#pragma once
// Image files as a Dataset: each item is one file decoded to uint8 (C, H, W) and put through an item
// transform to (C, size, size), with its target (a class index, or a multi-hot row for multi-label). The
// files are read and decoded when a batch is loaded, in the DataLoader's workers; images stay uint8 until
// the batch transforms (to_float, normalize). Also: listing the image files of a folder, and finding the
// files that do not decode.
#include <fastlearn/data/dataset.h>
#include <fastlearn/data/image_decode.h>
#include <fastlearn/data/image_transforms.h>

#include <filesystem>
#include <set>
#include <string>
#include <string_view>
#include <vector>

namespace fastlearn {

struct ImageDatasetOptions {
  ImageMode mode = ImageMode::rgb;
  /// Applied to every decoded image; must give the same shape for every file (for stacking).
  ItemTransform item_tfm;
  /// JPEG files are decoded at the smallest libjpeg-turbo scale that keeps both sides >= this (0: full size).
  std::int64_t decode_min_side = 0;
  /// Training: the item transform draws from the batch's generator; otherwise it gets none (deterministic).
  bool random = false;
};

class ImageDataset : public Dataset {
 public:
  /// `targets`: int64 (N) class indices or float (N, c) multi-hot rows, one per file; undefined for files
  /// without labels (items and batches then have no targets: test_dl's).
  ImageDataset(std::vector<std::filesystem::path> files, at::Tensor targets, ImageDatasetOptions options);

  std::int64_t size() const override { return static_cast<std::int64_t>(files_.size()); }
  /// Item `index` without randomness (as validation sees it).
  Item get(std::int64_t index) const override;
  Batch get_batch(std::span<const std::int64_t> indices) const override;
  Batch load_batch(std::span<const std::int64_t> indices, at::Generator& rng) const override;

  const std::vector<std::filesystem::path>& files() const { return files_; }
  const at::Tensor& targets() const { return targets_; }
  const ImageDatasetOptions& options() const { return options_; }
  /// The file decoded and transformed as items are (with `rng` for the random transforms, or none).
  at::Tensor load_image(std::int64_t index, at::Generator* rng) const;

 private:
  Batch load(std::span<const std::int64_t> indices, at::Generator* rng) const;

  std::vector<std::filesystem::path> files_;
  at::Tensor targets_;
  ImageDatasetOptions options_;
};

/// The files under `dir` (recursively, following no symbolic links to folders) whose extension is .jpg,
/// .jpeg or .png in any case, sorted by path. DataError when `dir` is not a folder.
std::vector<std::filesystem::path> get_image_files(const std::filesystem::path& dir);

struct BadImage {
  std::filesystem::path file;
  std::string error;  ///< why it does not decode
};

/// Per-channel mean and standard deviation (population) of the pixels of `dataset`'s items in [0, 1], as
/// validation sees them (no random transform). Over all items, or over `max_items` of them drawn without
/// replacement by `seed`; decoded with `threads` threads (0: all cores). fastai's Normalize without stats
/// estimates them from one batch; this uses as many images as asked.
struct ChannelStatistics {
  std::vector<double> mean, std;
};
ChannelStatistics channel_statistics(const ImageDataset& dataset, std::int64_t max_items = 0, std::uint64_t seed = 0,
                                     int threads = 0);

/// Decodes every file (with `threads` threads; 0: all cores) and returns those that fail, in file order.
std::vector<BadImage> verify_images(const std::vector<std::filesystem::path>& files, int threads = 0);
/// verify_images of get_image_files(dir).
std::vector<BadImage> verify_images(const std::filesystem::path& dir, int threads = 0);

/// The files of `files` that do not decode (verify_images), after one warning that counts and names them (up to 10):
/// "skipping <n> <what> that do not decode: ...". Empty, and no warning, when every file decodes.
std::set<std::filesystem::path> skipped_bad_images(const std::vector<std::filesystem::path>& files,
                                                   std::string_view what);

}  // namespace fastlearn
