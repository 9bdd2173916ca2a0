#pragma once
// Images and their segmentation masks as a Dataset: each item is an image file decoded to uint8 (C, H, W) and its mask
// (a PNG of class indices, read raw: image_decode.h's read_mask) put through one pair transform, which moves both by
// the same draws. Batches hold the images, uint8 (N, C, h, w), as input and the masks, int64 (N, h, w) class
// indices, as target. check_masks reads every mask once before training and refuses what would fail later.
#include <fastlearn/data/dataset.h>
#include <fastlearn/data/image_decode.h>
#include <fastlearn/data/image_transforms.h>

#include <filesystem>
#include <vector>

namespace fastlearn {

struct SegmentationDatasetOptions {
  ImageMode mode = ImageMode::rgb;
  /// Applied to every image and its mask; must give the same size for every item (for stacking).
  PairTransform item_tfm;
  /// Training: the item transform draws from the batch's generator; otherwise it gets none (deterministic).
  bool random = false;
  /// Masks store their two classes as 0 and 255 (check_masks finds it): 255 is read as class 1.
  bool binary_255 = false;
};

class SegmentationDataset : public Dataset {
 public:
  /// `masks[i]` is `images[i]`'s mask; `classes` the number of codes (at most 256).
  SegmentationDataset(std::vector<std::filesystem::path> images, std::vector<std::filesystem::path> masks,
                      std::int64_t classes, SegmentationDatasetOptions options);

  std::int64_t size() const override { return static_cast<std::int64_t>(images_.size()); }
  Item get(std::int64_t index) const override;
  Batch get_batch(std::span<const std::int64_t> indices) const override;
  Batch load_batch(std::span<const std::int64_t> indices, at::Generator& rng) const override;

  const std::vector<std::filesystem::path>& images() const { return images_; }
  const std::vector<std::filesystem::path>& masks() const { return masks_; }
  const SegmentationDatasetOptions& options() const { return options_; }
  /// Item `index`'s image, uint8 (C, h, w), and mask, uint8 (h, w) class indices, transformed as batches have them
  /// (with `rng` for the random transforms, or none). DataError naming the file when a mask value is no class.
  std::pair<at::Tensor, at::Tensor> load_pair(std::int64_t index, at::Generator* rng) const;

 private:
  Batch load(std::span<const std::int64_t> indices, at::Generator* rng) const;

  std::vector<std::filesystem::path> images_, masks_;
  std::int64_t classes_;
  SegmentationDatasetOptions options_;
};

/// What check_masks found.
struct MaskScan {
  bool binary_255 = false;  ///< two classes stored as 0 and 255 (every mask holds only those values, some hold 255)
};

/// Reads every mask (with `threads` threads; 0: all cores) and checks it against its image, throwing DataError naming
/// the file: first, the first mask in file order that does not exist, does not decode as a mask (image_decode.h's
/// decode_mask: a JPEG or an RGB PNG is refused), or whose height and width differ from its image's (read from the
/// image file's header); then the first with a value that is no class (the value and a pixel where it is). With two
/// classes, masks that hold only 0 and 255 are read as 0 and 1 (binary_255).
MaskScan check_masks(const std::vector<std::filesystem::path>& images, const std::vector<std::filesystem::path>& masks,
                     std::int64_t classes, int threads = 0);

}  // namespace fastlearn
