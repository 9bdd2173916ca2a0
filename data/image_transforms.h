#pragma once
// Item transforms for images: each takes one decoded uint8 (C, H, W) image and returns it uint8
// (C, size, size), ready to be stacked into a batch. They run in the DataLoader's workers. With a
// generator (training) the random ones draw from it; without one (validation) they are deterministic.
// Resampling is bilinear with antialiasing (as PIL's and torchvision's antialiased resize).
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
  pad,     ///< scale the longer side to size, pad the shorter with zeros on both sides
  squish,  ///< scale each side to size, changing the aspect ratio
};

/// "crop", "pad" or "squish"; DataError otherwise.
ResizeMethod resize_method(std::string_view name);

/// A function of (image, generator or null) -> image.
using ItemTransform = std::function<at::Tensor(const at::Tensor& image, at::Generator* rng)>;

/// Resizes to size x size by `method`.
at::Tensor resize_image(const at::Tensor& image, std::int64_t size, ResizeMethod method, at::Generator* rng = nullptr);

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

/// Item transform objects for datasets.
ItemTransform resize(std::int64_t size, ResizeMethod method = ResizeMethod::crop);
ItemTransform random_resized_crop(std::int64_t size, RandomResizedCropOptions options = {});

}  // namespace fastlearn
