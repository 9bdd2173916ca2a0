#include <fastlearn/data/image_transforms.h>

#include <fastlearn/core/detail/text.h>
#include <fastlearn/core/error.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/torch.h>

#include <algorithm>
#include <array>
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
  throw DataError(fmt::format("resize method '{}' is not one of crop, pad, squish", excerpt(name)));
}

PadMode pad_mode(std::string_view name) {
  if (name == "reflection") return PadMode::reflection;
  if (name == "zeros") return PadMode::zeros;
  if (name == "border") return PadMode::border;
  throw DataError(fmt::format("pad mode '{}' is not one of reflection, zeros, border", excerpt(name)));
}

namespace {

// Pads a (C, H, W) image by {left, right, top, bottom}. Reflection pads of more than the image's side minus one
// go in rounds, each mirroring what the last made (numpy's 'reflect', which fastai's PIL path uses).
at::Tensor pad_image(const at::Tensor& image, std::array<std::int64_t, 4> pads, PadMode mode) {
  if (mode == PadMode::zeros) return at::constant_pad_nd(image, {pads[0], pads[1], pads[2], pads[3]}, 0);
  auto out = image.unsqueeze(0);
  if (mode == PadMode::border) return at::replication_pad2d(out, {pads[0], pads[1], pads[2], pads[3]}).squeeze(0);
  while (pads[0] + pads[1] + pads[2] + pads[3] > 0) {
    const auto w = out.size(3) - 1, h = out.size(2) - 1;  // the most one reflection can add on a side
    std::array<std::int64_t, 4> step{std::min(pads[0], w), std::min(pads[1], w), std::min(pads[2], h),
                                     std::min(pads[3], h)};
    if (step == std::array<std::int64_t, 4>{}) {  // a side of one pixel: nothing to mirror, so repeat it
      return at::replication_pad2d(out, {pads[0], pads[1], pads[2], pads[3]}).squeeze(0);
    }
    out = at::reflection_pad2d(out, {step[0], step[1], step[2], step[3]});
    for (std::size_t i = 0; i < 4; ++i) pads[i] -= step[i];
  }
  return out.squeeze(0);
}

// Where crop and pad put their window, as fractions of the room along (height, width): drawn in training,
// the centre otherwise.
std::array<double, 2> window_placement(at::Generator* rng) {
  if (!rng) return {0.5, 0.5};
  const auto draws = uniform(*rng, 2);
  return {draws[0].item<double>(), draws[1].item<double>()};
}

}  // namespace

at::Tensor resize_image(const at::Tensor& image, std::int64_t size, ResizeMethod method, at::Generator* rng,
                        PadMode padding) {
  check_image(image, size, "resize");
  const auto h = image.size(1), w = image.size(2);
  switch (method) {
    case ResizeMethod::squish:
      return resample(image, size, size);
    case ResizeMethod::crop: {
      const auto side = std::min(h, w);
      const auto u = window_placement(rng);
      const auto top = offset(h, side, u[0], rng != nullptr), left = offset(w, side, u[1], rng != nullptr);
      return resample(image.narrow(1, top, side).narrow(2, left, side), size, size);
    }
    case ResizeMethod::pad: {
      // fastai's arithmetic: the window is int(m * size) for the larger ratio m, placed at int(u * (side -
      // window)) (truncation toward zero, so a window longer than the side starts before it).
      const double ratio = std::max(double(w) / double(size), double(h) / double(size));
      const auto window = std::max<std::int64_t>(1, static_cast<std::int64_t>(ratio * double(size)));
      const auto u = window_placement(rng);
      const auto top = static_cast<std::int64_t>(u[0] * double(h - window));
      const auto left = static_cast<std::int64_t>(u[1] * double(w - window));
      const auto row0 = std::max<std::int64_t>(top, 0), col0 = std::max<std::int64_t>(left, 0);
      const auto inside =
          image.narrow(1, row0, std::min(top + window, h) - row0).narrow(2, col0, std::min(left + window, w) - col0);
      const auto padded = pad_image(inside,
                                    {std::max<std::int64_t>(-left, 0), std::max<std::int64_t>(left + window - w, 0),
                                     std::max<std::int64_t>(-top, 0), std::max<std::int64_t>(top + window - h, 0)},
                                    padding);
      return resample(padded, size, size);
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

ItemTransform resize(std::int64_t size, ResizeMethod method, PadMode padding) {
  if (size < 1) throw DataError(fmt::format("resize: size {} must be positive", size));
  return [size, method, padding](const at::Tensor& image, at::Generator* rng) {
    return resize_image(image, size, method, rng, padding);
  };
}

ItemTransform random_resized_crop(std::int64_t size, RandomResizedCropOptions options) {
  if (size < 1) throw DataError(fmt::format("random_resized_crop: size {} must be positive", size));
  return [size, options](const at::Tensor& image, at::Generator* rng) {
    return random_resized_crop(image, size, rng, options);
  };
}

}  // namespace fastlearn
