#include <fastlearn/data/segmentation_dataloaders.h>

#include <fastlearn/core/detail/text.h>
#include <fastlearn/core/detail/warning.h>
#include <fastlearn/core/error.h>
#include <fastlearn/data/detail/model_input.h>
#include <fastlearn/data/image_dataset.h>
#include <fastlearn/data/inference_pipeline.h>
#include <fastlearn/data/random_splitter.h>
#include <fastlearn/data/segmentation_dataset.h>
#include <fastlearn/data/transforms.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <map>
#include <set>

namespace fastlearn {

namespace fs = std::filesystem;

namespace {

struct Pairs {
  std::vector<fs::path> images, masks;
};

// Leaves out the pairs whose image does not decode, with one warning that counts and names them (a mask that does
// not decode stays an error: it is the label).
void drop_bad_images(Pairs& all, const char* origin) {
  const auto bad_files = skipped_bad_images(all.images, fmt::format("image(s) of {}, with their masks,", origin));
  if (bad_files.empty()) return;
  Pairs kept;
  for (std::size_t i = 0; i < all.images.size(); ++i) {
    if (bad_files.contains(all.images[i])) continue;
    kept.images.push_back(std::move(all.images[i]));
    kept.masks.push_back(std::move(all.masks[i]));
  }
  all = std::move(kept);
}

DataLoaders build(Pairs all, std::vector<std::string> codes, const ImageFilesOptions& options, const char* origin) {
  const auto size = options.item_size.value_or(ImageSize{options.size, options.size});
  if (size.height < 1 || size.width < 1) {
    throw DataError(fmt::format("{}: item size {}x{} must be positive", origin, size.height, size.width));
  }
  if (codes.empty()) throw DataError(fmt::format("{}: no codes; name each class of the masks, in index order", origin));
  if (std::set<std::string>(codes.begin(), codes.end()).size() != codes.size()) {
    throw DataError(fmt::format("{}: the codes [{}] name a class twice", origin, fmt::join(excerpts(codes), ", ")));
  }
  if (options.flip_vert && options.flip_p > 0 && size.height != size.width) {
    throw DataError(
        fmt::format("{}: flip_vert turns items by the square's symmetries, which keep only square items "
                    "whole; item size {}x{} is not square (flip_vert = false flips left-right)",
                    origin, size.height, size.width));
  }
  if (options.skip_bad_images) drop_bad_images(all, origin);
  if (all.images.empty()) throw DataError(fmt::format("{}: no images", origin));
  const auto classes = static_cast<std::int64_t>(codes.size());
  const auto scan = check_masks(all.images, all.masks, classes);
  if (scan.binary_255) {
    warn(fmt::format("{}: the masks hold only 0 and 255 and there are two codes: 255 is read as class 1 ('{}')", origin,
                     excerpt(codes[1])));
  }
  const auto is_valid =
      random_valid_mask(static_cast<std::int64_t>(all.images.size()), options.valid_pct, options.split_seed, origin);
  Pairs train, valid;
  for (std::size_t i = 0; i < all.images.size(); ++i) {
    auto& part = is_valid[i] ? valid : train;
    part.images.push_back(std::move(all.images[i]));
    part.masks.push_back(std::move(all.masks[i]));
  }
  if (train.images.empty()) throw DataError(fmt::format("{}: no training images", origin));
  if (valid.images.empty()) throw DataError(fmt::format("{}: no validation images", origin));

  const auto valid_tfm = resize_pair(size, options.method, options.pad_mode);
  const auto train_tfm =
      options.min_scale < 1.0 ? random_resized_crop_pair(size, {.min_scale = options.min_scale}) : valid_tfm;
  const SegmentationDatasetOptions item_options{.mode = options.mode, .binary_255 = scan.binary_255};
  auto with = [&](PairTransform tfm, bool random) {
    auto o = item_options;
    o.item_tfm = std::move(tfm);
    o.random = random;
    return o;
  };
  ChannelStatistics stats;
  if (options.normalize == ImageNormalization::computed) {
    // The training images as validation sees them (resized, no randomness).
    const ImageDataset images(
        train.images, at::Tensor(),
        ImageDatasetOptions{.mode = options.mode, .item_tfm = resize(size, options.method, options.pad_mode)});
    stats = channel_statistics(images, options.stats_items, options.split_seed);
    for (auto& s : stats.std) s = std::max(s, 1e-7);
  }
  auto train_ds = std::make_shared<SegmentationDataset>(std::move(train.images), std::move(train.masks), classes,
                                                        with(train_tfm, true));
  auto valid_ds = std::make_shared<SegmentationDataset>(std::move(valid.images), std::move(valid.masks), classes,
                                                        with(valid_tfm, false));
  auto [train_dl, valid_dl] = image_loaders(train_ds, valid_ds, options, stats, /*masks=*/true);
  DataLoaders dls(std::move(train_dl), std::move(valid_dl), std::move(codes));
  auto [mean, std] = model_input_mean_std(options, stats);
  // New images (test_dl, an export) are read as the validation images are: decoded at full scale, as the masks must be.
  dls.set_image_pipeline(std::make_shared<ImagePipeline>(ImagePipeline{.mode = options.mode,
                                                                       .size = size,
                                                                       .method = options.method,
                                                                       .pad_mode = options.pad_mode,
                                                                       .mean = std::move(mean),
                                                                       .std = std::move(std),
                                                                       .masks = true}));
  return dls;
}

}  // namespace

DataLoaders SegmentationDataLoaders::from_label_func(std::vector<fs::path> images,
                                                     const std::function<fs::path(const fs::path&)>& label_func,
                                                     std::vector<std::string> codes, const ImageFilesOptions& options) {
  Pairs all;
  for (auto& image : images) {
    all.masks.push_back(label_func(image));
    all.images.push_back(std::move(image));
  }
  return build(std::move(all), std::move(codes), options, "SegmentationDataLoaders::from_label_func");
}

DataLoaders SegmentationDataLoaders::from_folders(const fs::path& images_dir, const fs::path& masks_dir,
                                                  std::vector<std::string> codes, const ImageFilesOptions& options) {
  constexpr const char* origin = "SegmentationDataLoaders::from_folders";
  // A file's key: its path under its folder without the suffix ("sub/a.jpg" and "sub/a.png" are "sub/a").
  auto key_of = [](const fs::path& file, const fs::path& root) {
    return file.lexically_relative(root).replace_extension().string();
  };
  std::map<std::string, fs::path> mask_of;
  for (auto& mask : get_image_files(masks_dir)) {
    const auto key = key_of(mask, masks_dir);
    if (auto [at, added] = mask_of.emplace(key, mask); !added) {
      throw DataError(fmt::format("{}: two masks are '{}': '{}' and '{}'", origin, excerpt(key),
                                  excerpt(at->second.string(), 256), excerpt(mask.string(), 256)));
    }
  }
  Pairs all;
  std::set<std::string> used;
  for (auto& image : get_image_files(images_dir)) {
    const auto key = key_of(image, images_dir);
    const auto mask = mask_of.find(key);
    if (mask == mask_of.end()) {
      throw DataError(fmt::format("{}: the image '{}' has no mask '{}.*' in '{}'", origin, excerpt(image.string(), 256),
                                  excerpt(key), excerpt(masks_dir.string(), 256)));
    }
    if (!used.insert(key).second) {
      throw DataError(fmt::format("{}: two images are '{}' (one mask each is needed): '{}' and another suffix", origin,
                                  excerpt(key), excerpt(image.string(), 256)));
    }
    all.masks.push_back(mask->second);
    all.images.push_back(std::move(image));
  }
  if (used.size() < mask_of.size()) {
    warn(fmt::format("{}: {} mask(s) in '{}' have no image and are left out", origin, mask_of.size() - used.size(),
                     excerpt(masks_dir.string(), 256)));
  }
  return build(std::move(all), std::move(codes), options, origin);
}

}  // namespace fastlearn
