#include <fastlearn/data/image_transforms.h>

#include <fastlearn/core/error.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>

namespace fastlearn {
namespace {

void check_image(const at::Tensor& image, std::int64_t size, const char* transform) {
  if (image.dim() != 3 || image.scalar_type() != at::kByte) {
    throw DataError(fmt::format("{}: expects a uint8 image shaped (C, H, W), got {} shaped [{}]", transform,
                                c10::toString(image.scalar_type()), fmt::join(image.sizes(), ", ")));
  }
  if (image.size(1) < 1 || image.size(2) < 1) throw DataError(fmt::format("{}: the image is empty", transform));
  if (size < 1) throw DataError(fmt::format("{}: size {} must be positive", transform, size));
}

// Bilinear resampling with antialiasing of a uint8 (C, H, W) image to (C, height, width). ATen resamples
// uint8 images held channels-last directly (vectorized, rounding once), without a float copy.
at::Tensor resample(const at::Tensor& image, std::int64_t height, std::int64_t width) {
  if (image.size(1) == height && image.size(2) == width) return image.contiguous();
  auto x = image.unsqueeze(0).contiguous(at::MemoryFormat::ChannelsLast);
  auto y = at::_upsample_bilinear2d_aa(x, {height, width}, /*align_corners=*/false);
  return y.squeeze(0);  // channels-last in memory; collating copies it into the batch
}

// Uniform draws in [0, 1) from `rng`.
at::Tensor uniform(at::Generator& rng, std::int64_t n) {
  return at::rand({n}, rng, at::TensorOptions().dtype(at::kDouble));
}

// Offset of a window of `inner` in `outer`: random in training, centred otherwise.
std::int64_t offset(std::int64_t outer, std::int64_t inner, double u, bool random) {
  const auto room = outer - inner;
  if (room <= 0) return 0;
  return random ? std::min(room, static_cast<std::int64_t>(u * static_cast<double>(room + 1))) : room / 2;
}

}  // namespace

ResizeMethod resize_method(std::string_view name) {
  if (name == "crop") return ResizeMethod::crop;
  if (name == "pad") return ResizeMethod::pad;
  if (name == "squish") return ResizeMethod::squish;
  throw DataError(fmt::format("resize method '{}' is not one of crop, pad, squish", name));
}

at::Tensor resize_image(const at::Tensor& image, std::int64_t size, ResizeMethod method, at::Generator* rng) {
  check_image(image, size, "resize");
  const auto h = image.size(1), w = image.size(2);
  switch (method) {
    case ResizeMethod::squish:
      return resample(image, size, size);
    case ResizeMethod::crop: {
      const auto side = std::min(h, w);
      double u[2] = {0.5, 0.5};
      if (rng) {
        auto draws = uniform(*rng, 2);
        u[0] = draws[0].item<double>();
        u[1] = draws[1].item<double>();
      }
      const auto top = offset(h, side, u[0], rng != nullptr), left = offset(w, side, u[1], rng != nullptr);
      return resample(image.narrow(1, top, side).narrow(2, left, side), size, size);
    }
    case ResizeMethod::pad: {
      // The longer side becomes size; the shorter keeps the ratio (at least 1 pixel) and is padded.
      const auto new_h = h >= w ? size : std::max<std::int64_t>(1, std::llround(double(h) * size / w));
      const auto new_w = w >= h ? size : std::max<std::int64_t>(1, std::llround(double(w) * size / h));
      auto scaled = resample(image, new_h, new_w);
      const auto pad_h = size - new_h, pad_w = size - new_w;
      return at::constant_pad_nd(scaled, {pad_w / 2, pad_w - pad_w / 2, pad_h / 2, pad_h - pad_h / 2}, 0);
    }
  }
  throw DataError("resize: unknown method");
}

at::Tensor random_resized_crop(const at::Tensor& image, std::int64_t size, at::Generator* rng,
                               const RandomResizedCropOptions& options) {
  check_image(image, size, "random_resized_crop");
  const auto& [r0, r1] = options.ratio;
  if (!(options.min_scale > 0 && options.min_scale <= options.max_scale && options.max_scale <= 1) ||
      !(r0 > 0 && r0 <= r1)) {
    throw DataError(fmt::format("random_resized_crop: scale [{}, {}] must lie in (0, 1] and ratio [{}, {}] be positive",
                                options.min_scale, options.max_scale, r0, r1));
  }
  if (!rng) return resize_image(image, size, ResizeMethod::crop);
  const auto h = image.size(1), w = image.size(2);
  const double area = static_cast<double>(h) * static_cast<double>(w);
  const double log_r0 = std::log(r0), log_r1 = std::log(r1);
  auto draws = uniform(*rng, 40);
  const double* u = draws.data_ptr<double>();
  for (int attempt = 0; attempt < 10; ++attempt, u += 4) {
    const double target = area * (options.min_scale + u[0] * (options.max_scale - options.min_scale));
    const double aspect = std::exp(log_r0 + u[1] * (log_r1 - log_r0));
    const auto cw = static_cast<std::int64_t>(std::llround(std::sqrt(target * aspect)));
    const auto ch = static_cast<std::int64_t>(std::llround(std::sqrt(target / aspect)));
    if (cw > 0 && ch > 0 && cw <= w && ch <= h) {
      const auto top = offset(h, ch, u[2], true), left = offset(w, cw, u[3], true);
      return resample(image.narrow(1, top, ch).narrow(2, left, cw), size, size);
    }
  }
  // No draw fitted: the centred crop of the whole image, its ratio clamped into the range.
  const double ratio = static_cast<double>(w) / static_cast<double>(h);
  std::int64_t cw = w, ch = h;
  if (ratio < r0) ch = std::max<std::int64_t>(1, std::llround(double(w) / r0));
  if (ratio > r1) cw = std::max<std::int64_t>(1, std::llround(double(h) * r1));
  return resample(image.narrow(1, (h - ch) / 2, ch).narrow(2, (w - cw) / 2, cw), size, size);
}

ItemTransform resize(std::int64_t size, ResizeMethod method) {
  if (size < 1) throw DataError(fmt::format("resize: size {} must be positive", size));
  return [size, method](const at::Tensor& image, at::Generator* rng) { return resize_image(image, size, method, rng); };
}

ItemTransform random_resized_crop(std::int64_t size, RandomResizedCropOptions options) {
  if (size < 1) throw DataError(fmt::format("random_resized_crop: size {} must be positive", size));
  return [size, options](const at::Tensor& image, at::Generator* rng) {
    return random_resized_crop(image, size, rng, options);
  };
}

}  // namespace fastlearn
