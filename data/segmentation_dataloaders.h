#pragma once
// SegmentationDataLoaders: the train and valid loaders of a segmentation task, images paired with masks (PNGs of
// class indices, one per image, the same height and width) by a function (fastai's from_label_func) or by name across
// two folders. `codes` name the classes in index order (fastai's codes); the valid_pct split is seeded (split_seed),
// as for the image loaders, and so are the other ImageFilesOptions (item_size any shape; flip_vert square items only;
// skip_bad_images leaves out the pairs whose image does not decode).
//
// Before anything is loaded every mask is read once and checked (segmentation_dataset.h, check_masks): a missing or
// lossy mask, a size that differs from its image's, a value that is no class is refused naming the file. Then:
// decode (full scale: the mask is at the image's size) -> one pair transform in the workers (Resize to item_size, or
// RandomResizedCrop for training when min_scale < 1) -> uint8 images and int64 masks -> training only: left-right
// flip (or with flip_vert the square's symmetries) of image and mask together -> to float in [0, 1] -> training,
// when asked: aug_transforms on both (the masks nearest) -> normalize the images (ImageNet statistics by default).
#include <fastlearn/data/dataloaders.h>
#include <fastlearn/data/image_dataloaders.h>

#include <filesystem>
#include <functional>
#include <string>
#include <vector>

namespace fastlearn {

struct SegmentationDataLoaders {
  /// Masks from `label_func(image)` (fastai's from_label_func): its path for each image.
  static DataLoaders from_label_func(
      std::vector<std::filesystem::path> images,
      const std::function<std::filesystem::path(const std::filesystem::path&)>& label_func,
      std::vector<std::string> codes, const ImageFilesOptions& options = {});
  /// The images under `images_dir` (get_image_files) and the masks under `masks_dir` paired by their paths under
  /// those folders without the suffix ("sub/a.jpg" with "sub/a.png"): an image without a mask, or two files of one
  /// name on either side, is a DataError naming them; masks without an image are left out with a warning.
  static DataLoaders from_folders(const std::filesystem::path& images_dir, const std::filesystem::path& masks_dir,
                                  std::vector<std::string> codes, const ImageFilesOptions& options = {});
};

}  // namespace fastlearn
