#include <fastlearn/data/segmentation_dataset.h>

#include <fastlearn/core/detail/text.h>
#include <fastlearn/core/error.h>
#include <fastlearn/data/detail/buffer_pool.h>
#include <fastlearn/data/detail/file_threads.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/torch.h>

#include <exception>
#include <optional>
#include <set>

namespace fastlearn {

namespace {

constexpr std::int64_t kMaxClasses = 256;  // class indices travel as uint8 until the batch

// The first pixel (row, column) of `values` that holds `value`.
std::pair<std::int64_t, std::int64_t> pixel_of(const at::Tensor& values, std::int64_t value) {
  const auto flat = values.eq(value).flatten().nonzero();
  const auto at = flat.numel() > 0 ? flat[0][0].item<std::int64_t>() : 0;
  return {at / values.size(1), at % values.size(1)};
}

// The mask's values as class indices, uint8; DataError naming `file` for a value that is no class.
at::Tensor class_indices(const at::Tensor& values, std::int64_t classes, bool binary_255,
                         const std::filesystem::path& file) {
  auto indices = binary_255 ? values.div(255, "floor") : values;
  const auto top = indices.max().item<std::int64_t>();
  if (top >= classes || (binary_255 && !values.remainder(255).eq(0).all().item<bool>())) {
    const auto bad = binary_255 ? values.remainder(255).ne(0).logical_or(indices.ge(classes)) : indices.ge(classes);
    const auto value = values.masked_select(bad)[0].item<std::int64_t>();
    const auto [row, column] = pixel_of(values, value);
    throw DataError(fmt::format("{}: mask value {} at row {}, column {} is not a class: there are {} codes{}",
                                excerpt(file.string(), 256), value, row, column, classes,
                                binary_255 ? " (masks holding 0 and 255 were read as classes 0 and 1)" : ""));
  }
  return indices.to(torch::kUInt8);
}

}  // namespace

SegmentationDataset::SegmentationDataset(std::vector<std::filesystem::path> images,
                                         std::vector<std::filesystem::path> masks, std::int64_t classes,
                                         SegmentationDatasetOptions options)
    : images_(std::move(images)), masks_(std::move(masks)), classes_(classes), options_(std::move(options)) {
  if (images_.size() != masks_.size()) {
    throw DataError(fmt::format("SegmentationDataset: {} images but {} masks", images_.size(), masks_.size()));
  }
  if (classes_ < 1 || classes_ > kMaxClasses) {
    throw DataError(fmt::format("SegmentationDataset: {} classes; masks take 1 to {}", classes_, kMaxClasses));
  }
}

std::pair<at::Tensor, at::Tensor> SegmentationDataset::load_pair(std::int64_t index, at::Generator* rng) const {
  if (index < 0 || index >= size()) {
    throw DataError(fmt::format("SegmentationDataset: index {} is outside [0, {})", index, size()));
  }
  const auto i = static_cast<std::size_t>(index);
  auto image = read_image(images_[i], {.mode = options_.mode});
  auto mask = class_indices(read_mask(masks_[i]), classes_, options_.binary_255, masks_[i]);
  if (mask.size(0) != image.size(1) || mask.size(1) != image.size(2)) {
    throw DataError(fmt::format("{}: the mask is {}x{} but its image '{}' {}x{}", excerpt(masks_[i].string(), 256),
                                mask.size(0), mask.size(1), excerpt(images_[i].string(), 256), image.size(1),
                                image.size(2)));
  }
  if (!options_.item_tfm) return {image, mask};
  std::pair<at::Tensor, at::Tensor> item;
  try {
    item = options_.item_tfm(image, mask, options_.random ? rng : nullptr);
  } catch (const DataError& e) {
    throw DataError(fmt::format("{}: {}", excerpt(images_[i].string(), 256), e.what()));
  }
  const auto& [out_image, out_mask] = item;
  if (out_image.dim() != 3 || out_mask.dim() != 2 || out_mask.size(0) != out_image.size(1) ||
      out_mask.size(1) != out_image.size(2)) {
    throw DataError(fmt::format(
        "{}: the item transform made an image [{}] and a mask [{}]; a mask is (H, W) at its "
        "image's height and width",
        excerpt(images_[i].string(), 256), fmt::join(out_image.sizes(), ", "), fmt::join(out_mask.sizes(), ", ")));
  }
  return item;
}

Batch SegmentationDataset::load(std::span<const std::int64_t> indices, at::Generator* rng) const {
  at::Tensor images, masks;  // (N, C, h, w) and (N, h, w), in the loader's batch memory
  for (std::size_t k = 0; k < indices.size(); ++k) {
    auto [image, mask] = load_pair(indices[k], rng);
    if (k == 0) {
      const auto n = static_cast<std::int64_t>(indices.size());
      images = pooled_empty({n, image.size(0), image.size(1), image.size(2)}, image.options());
      masks = pooled_empty({n, mask.size(0), mask.size(1)}, torch::TensorOptions().dtype(torch::kLong));
    } else if (image.sizes() != images.sizes().slice(1)) {
      throw DataError(fmt::format(
          "SegmentationDataset: '{}' comes out [{}] but '{}' [{}]; give an item transform (resize_pair) that makes "
          "every item the same size",
          excerpt(images_[static_cast<std::size_t>(indices[k])].string(), 256), fmt::join(image.sizes(), ", "),
          excerpt(images_[static_cast<std::size_t>(indices.front())].string(), 256),
          fmt::join(images.sizes().slice(1), ", ")));
    }
    images[static_cast<std::int64_t>(k)].copy_(image);
    masks[static_cast<std::int64_t>(k)].copy_(mask);
  }
  if (!images.defined()) return {{torch::empty({0}, torch::kUInt8)}, {torch::empty({0}, torch::kLong)}};
  return {{images}, {masks}};
}

Item SegmentationDataset::get(std::int64_t index) const {
  auto [image, mask] = load_pair(index, nullptr);
  return {{image}, {mask.to(torch::kLong)}};
}

Batch SegmentationDataset::get_batch(std::span<const std::int64_t> indices) const { return load(indices, nullptr); }

Batch SegmentationDataset::load_batch(std::span<const std::int64_t> indices, at::Generator& rng) const {
  return load(indices, &rng);
}

MaskScan check_masks(const std::vector<std::filesystem::path>& images, const std::vector<std::filesystem::path>& masks,
                     std::int64_t classes, int threads) {
  if (images.size() != masks.size()) {
    throw DataError(fmt::format("check_masks: {} images but {} masks", images.size(), masks.size()));
  }
  if (classes < 1 || classes > kMaxClasses) {
    throw DataError(fmt::format("check_masks: {} classes; masks take 1 to {}", classes, kMaxClasses));
  }
  // Per mask: an error, or its distinct values (few: one per class present).
  std::vector<std::string> errors(masks.size());
  std::vector<at::Tensor> distinct(masks.size());
  for_each_file(masks.size(), threads, [&](std::size_t i) {
    try {
      std::error_code missing;
      if (!std::filesystem::exists(masks[i], missing)) {
        throw DataError(fmt::format("{}: the mask of '{}' does not exist", excerpt(masks[i].string(), 256),
                                    excerpt(images[i].string(), 256)));
      }
      const auto values = read_mask(masks[i]);
      const auto image = read_image_size(images[i]);
      if (values.size(0) != image.height || values.size(1) != image.width) {
        throw DataError(fmt::format("{}: the mask is {}x{} (height x width) but its image '{}' is {}x{}",
                                    excerpt(masks[i].string(), 256), values.size(0), values.size(1),
                                    excerpt(images[i].string(), 256), image.height, image.width));
      }
      distinct[i] = std::get<0>(at::_unique(values.flatten(), /*sorted=*/true));
    } catch (const std::exception& e) {
      errors[i] = e.what();
    }
  });
  for (const auto& error : errors)
    if (!error.empty()) throw DataError(error);
  std::set<std::int64_t> seen;
  for (const auto& values : distinct) {
    const auto* v = values.data_ptr<std::int32_t>();
    seen.insert(v, v + values.numel());
  }
  MaskScan scan;
  scan.binary_255 = classes == 2 && seen.contains(255) &&
                    std::all_of(seen.begin(), seen.end(), [](std::int64_t v) { return v == 0 || v == 255; });
  // The first mask, in file order, with a value that is no class: named with the value and a pixel.
  for (std::size_t i = 0; i < masks.size(); ++i) {
    const auto& values = distinct[i];
    const auto top = values.numel() > 0 ? values.max().item<std::int64_t>() : 0;
    if (scan.binary_255 || top < classes) continue;
    class_indices(read_mask(masks[i]), classes, false, masks[i]);  // throws, naming the value and a pixel
  }
  return scan;
}

}  // namespace fastlearn
