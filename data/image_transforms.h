#pragma once
// Item transforms for images: each takes one decoded uint8 (C, H, W) image and returns it uint8
// (C, size, size), or (C, height, width) for an ImageSize, ready to be stacked into a batch. They run in the
// DataLoader's workers. With a generator (training) the random ones draw from it; without one (validation) they are
// deterministic. Resampling is bilinear with antialiasing (as PIL's and torchvision's antialiased resize).
//
// Pair transforms (segmentation) take an image and its mask, (H, W) class indices of any integer type, and move both
// by the same draws: the same window, padded alike, the image resampled bilinearly and the mask by nearest neighbour
// (the pixel under each output pixel's centre: PIL's NEAREST), so a class index is never blended.
#include <fastlearn/core/image_size.h>

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <string_view>
#include <utility>

namespace fastlearn {

/// How Resize makes a square of an image of another shape (fastai's ResizeMethod).
enum class ResizeMethod {
  crop,    ///< scale the shorter side to size, crop the longer: at a random position in training, centred otherwise
  pad,     ///< a square window as long as the longer side (the shorter padded, by PadMode), resized to size
  squish,  ///< scale each side to size, changing the aspect ratio
};

/// "crop", "pad" or "squish"; DataError otherwise.
ResizeMethod resize_method(std::string_view name);

/// What ResizeMethod::pad fills the window outside the image with (fastai's PadMode).
enum class PadMode {
  reflection,  ///< the image mirrored at its edge, the edge pixel not repeated (fastai's default)
  zeros,
  border,  ///< the edge pixel repeated
};

/// "reflection", "zeros" or "border"; DataError otherwise.
PadMode pad_mode(std::string_view name);

/// A function of (image, generator or null) -> image.
using ItemTransform = std::function<at::Tensor(const at::Tensor& image, at::Generator* rng)>;

/// Resizes to size x size by `method`, as fastai's Resize does (the same pixels for a centred window): crop
/// and pad place their window at random with a generator (training), at the centre without one. pad takes a
/// square window of the longer side's length (as fastai computes it: truncated from floats), fills the part
/// outside the image by `padding`, and resamples it.
at::Tensor resize_image(const at::Tensor& image, std::int64_t size, ResizeMethod method, at::Generator* rng = nullptr,
                        PadMode padding = PadMode::reflection);

struct RandomResizedCropOptions {
  double min_scale = 0.08;                            ///< smallest fraction of the image's area to keep
  double max_scale = 1.0;                             ///< largest fraction
  std::pair<double, double> ratio{3.0 / 4, 4.0 / 3};  ///< range of the crop's width / height, drawn log-uniformly
};

/// With a generator: a crop of random area and aspect ratio (10 draws; if none fits, the centred crop of
/// the largest area the ratio range allows), resized to size x size (torchvision's and fastai's
/// RandomResizedCrop). Without one: resize_image(image, size, crop), as for validation.
at::Tensor random_resized_crop(const at::Tensor& image, std::int64_t size, at::Generator* rng,
                               const RandomResizedCropOptions& options = {});

/// Non-square items: resize_image to height x width. crop takes the largest window of the item's aspect ratio inside
/// the image; pad the smallest window of that ratio around it (fastai's Resize with a (height, width) size).
at::Tensor resize_image(const at::Tensor& image, ImageSize size, ResizeMethod method, at::Generator* rng = nullptr,
                        PadMode padding = PadMode::reflection);
/// Non-square items: random_resized_crop resized to height x width.
at::Tensor random_resized_crop(const at::Tensor& image, ImageSize size, at::Generator* rng,
                               const RandomResizedCropOptions& options = {});

/// Item transform objects for datasets.
ItemTransform resize(std::int64_t size, ResizeMethod method = ResizeMethod::crop,
                     PadMode padding = PadMode::reflection);
ItemTransform resize(ImageSize size, ResizeMethod method = ResizeMethod::crop, PadMode padding = PadMode::reflection);
ItemTransform random_resized_crop(std::int64_t size, RandomResizedCropOptions options = {});
ItemTransform random_resized_crop(ImageSize size, RandomResizedCropOptions options = {});

/// A function of (image, mask, generator or null) -> (image, mask).
using PairTransform = std::function<std::pair<at::Tensor, at::Tensor>(const at::Tensor& image, const at::Tensor& mask,
                                                                      at::Generator* rng)>;
/// resize for an image and its mask: one window for both (DataError when the mask's size is not the image's).
PairTransform resize_pair(ImageSize size, ResizeMethod method = ResizeMethod::crop,
                          PadMode padding = PadMode::reflection);
/// random_resized_crop for an image and its mask: one draw for both.
PairTransform random_resized_crop_pair(ImageSize size, RandomResizedCropOptions options = {});

}  // namespace fastlearn
