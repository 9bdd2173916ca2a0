#include <fastlearn/data/image_transforms.h>

#include <fastlearn/core/detail/text.h>
#include <fastlearn/core/error.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/torch.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <vector>

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

namespace {

// The part of an image an item transform keeps: rows [top, top + height), columns [left, left + width), which may
// reach outside the image (pad: the outside filled by the pad mode); resampled to the item's size afterwards.
struct Window {
  std::int64_t top = 0, left = 0, height = 0, width = 0;
};

// Resize's window for an h x w image and an item of `size`, as fastai's Resize places it.
Window resize_window(std::int64_t h, std::int64_t w, ImageSize size, ResizeMethod method, at::Generator* rng) {
  switch (method) {
    case ResizeMethod::squish:
      return {0, 0, h, w};
    case ResizeMethod::crop: {
      // The largest window of the item's aspect ratio inside the image (in integers: fastai's float ratio can lose
      // a pixel).
      Window window{0, 0, h, w};
      if (w * size.height < h * size.width) {
        window.height = std::max<std::int64_t>(1, w * size.height / size.width);
      } else {
        window.width = std::max<std::int64_t>(1, h * size.width / size.height);
      }
      const auto u = window_placement(rng);
      window.top = offset(h, window.height, u[0], rng != nullptr);
      window.left = offset(w, window.width, u[1], rng != nullptr);
      return window;
    }
    case ResizeMethod::pad: {
      // fastai's arithmetic: the window is int(m * side) for the larger ratio m, placed at int(u * (side -
      // window)) (truncation toward zero, so a window longer than the side starts before it).
      const double ratio = std::max(double(w) / double(size.width), double(h) / double(size.height));
      Window window{0, 0, std::max<std::int64_t>(1, static_cast<std::int64_t>(ratio * double(size.height))),
                    std::max<std::int64_t>(1, static_cast<std::int64_t>(ratio * double(size.width)))};
      const auto u = window_placement(rng);
      window.top = static_cast<std::int64_t>(u[0] * double(h - window.height));
      window.left = static_cast<std::int64_t>(u[1] * double(w - window.width));
      return window;
    }
  }
  throw DataError("resize: unknown method");
}

// RandomResizedCrop's window: with a generator, a random area and aspect ratio (10 draws), else the centred crop of
// the largest area the ratio range allows; without one, Resize's centred crop.
Window random_resized_crop_window(std::int64_t h, std::int64_t w, ImageSize size, at::Generator* rng,
                                  const RandomResizedCropOptions& options) {
  const auto& [r0, r1] = options.ratio;
  if (!(options.min_scale > 0 && options.min_scale <= options.max_scale && options.max_scale <= 1) ||
      !(r0 > 0 && r0 <= r1)) {
    throw DataError(fmt::format("random_resized_crop: scale [{}, {}] must lie in (0, 1] and ratio [{}, {}] be positive",
                                options.min_scale, options.max_scale, r0, r1));
  }
  if (!rng) return resize_window(h, w, size, ResizeMethod::crop, nullptr);
  const double area = static_cast<double>(h) * static_cast<double>(w);
  const double log_r0 = std::log(r0), log_r1 = std::log(r1);
  auto draws = uniform(*rng, 40);
  const double* u = draws.data_ptr<double>();
  for (int attempt = 0; attempt < 10; ++attempt, u += 4) {
    const double target = area * (options.min_scale + u[0] * (options.max_scale - options.min_scale));
    const double aspect = std::exp(log_r0 + u[1] * (log_r1 - log_r0));
    const auto cw = static_cast<std::int64_t>(std::llround(std::sqrt(target * aspect)));
    const auto ch = static_cast<std::int64_t>(std::llround(std::sqrt(target / aspect)));
    if (cw > 0 && ch > 0 && cw <= w && ch <= h) return {offset(h, ch, u[2], true), offset(w, cw, u[3], true), ch, cw};
  }
  // No draw fitted: the centred crop of the whole image, its ratio clamped into the range.
  const double ratio = static_cast<double>(w) / static_cast<double>(h);
  std::int64_t cw = w, ch = h;
  if (ratio < r0) ch = std::max<std::int64_t>(1, std::llround(double(w) / r0));
  if (ratio > r1) cw = std::max<std::int64_t>(1, std::llround(double(h) * r1));
  return {(h - ch) / 2, (w - cw) / 2, ch, cw};
}

// The window's pixels of a (C, H, W) tensor, the part outside the image filled by `padding`.
at::Tensor cut(const at::Tensor& image, const Window& window, PadMode padding) {
  const auto h = image.size(1), w = image.size(2);
  const auto row0 = std::max<std::int64_t>(window.top, 0), col0 = std::max<std::int64_t>(window.left, 0);
  const auto row1 = std::min(window.top + window.height, h), col1 = std::min(window.left + window.width, w);
  const auto inside = image.narrow(1, row0, row1 - row0).narrow(2, col0, col1 - col0);
  const std::array<std::int64_t, 4> pads{col0 - window.left, window.left + window.width - col1, row0 - window.top,
                                         window.top + window.height - row1};
  if (pads == std::array<std::int64_t, 4>{}) return inside;
  return pad_image(inside, pads, padding);
}

// Nearest-neighbour resampling of a (C, H, W) tensor of any type to (C, height, width): each output pixel takes the
// source pixel under its centre, computed as PIL's NEAREST computes it (the centre stepped along in double precision
// and truncated), so that masks come out as fastai's to the pixel; torch's nearest-exact differs where a centre falls
// on a pixel's edge. Class indices stay as they are.
at::Tensor resample_nearest(const at::Tensor& mask, std::int64_t height, std::int64_t width) {
  auto source = [&mask](std::int64_t in, std::int64_t out) {
    std::vector<std::int64_t> index(static_cast<std::size_t>(out));
    const double step = static_cast<double>(in) / static_cast<double>(out);
    double centre = 0.5 * step;
    for (auto& i : index) {
      i = std::min(static_cast<std::int64_t>(centre), in - 1);
      centre += step;
    }
    return torch::tensor(index, torch::kLong).to(mask.device());
  };
  return mask.index_select(1, source(mask.size(1), height)).index_select(2, source(mask.size(2), width));
}

void check_mask(const at::Tensor& image, const at::Tensor& mask, const char* transform) {
  if (mask.dim() != 2 || mask.size(0) != image.size(1) || mask.size(1) != image.size(2)) {
    throw DataError(
        fmt::format("{}: the mask is [{}] but its image [{}]; a mask is (H, W), its image's height and width",
                    transform, fmt::join(mask.sizes(), ", "), fmt::join(image.sizes(), ", ")));
  }
}

void check_size(ImageSize size, const char* transform) {
  if (size.height < 1 || size.width < 1) {
    throw DataError(fmt::format("{}: size {}x{} must be positive", transform, size.height, size.width));
  }
}

}  // namespace

at::Tensor resize_image(const at::Tensor& image, ImageSize size, ResizeMethod method, at::Generator* rng,
                        PadMode padding) {
  check_image(image, std::min(size.height, size.width), "resize");
  const auto window = resize_window(image.size(1), image.size(2), size, method, rng);
  return resample(cut(image, window, padding), size.height, size.width);
}

at::Tensor resize_image(const at::Tensor& image, std::int64_t size, ResizeMethod method, at::Generator* rng,
                        PadMode padding) {
  return resize_image(image, ImageSize{size, size}, method, rng, padding);
}

at::Tensor random_resized_crop(const at::Tensor& image, ImageSize size, at::Generator* rng,
                               const RandomResizedCropOptions& options) {
  check_image(image, std::min(size.height, size.width), "random_resized_crop");
  const auto window = random_resized_crop_window(image.size(1), image.size(2), size, rng, options);
  return resample(cut(image, window, PadMode::reflection), size.height, size.width);
}

at::Tensor random_resized_crop(const at::Tensor& image, std::int64_t size, at::Generator* rng,
                               const RandomResizedCropOptions& options) {
  return random_resized_crop(image, ImageSize{size, size}, rng, options);
}

PairTransform resize_pair(ImageSize size, ResizeMethod method, PadMode padding) {
  check_size(size, "resize");
  return [size, method, padding](const at::Tensor& image, const at::Tensor& mask, at::Generator* rng) {
    check_image(image, std::min(size.height, size.width), "resize");
    check_mask(image, mask, "resize");
    const auto window = resize_window(image.size(1), image.size(2), size, method, rng);
    return std::pair{resample(cut(image, window, padding), size.height, size.width),
                     resample_nearest(cut(mask.unsqueeze(0), window, padding), size.height, size.width).squeeze(0)};
  };
}

PairTransform random_resized_crop_pair(ImageSize size, RandomResizedCropOptions options) {
  check_size(size, "random_resized_crop");
  return [size, options](const at::Tensor& image, const at::Tensor& mask, at::Generator* rng) {
    check_image(image, std::min(size.height, size.width), "random_resized_crop");
    check_mask(image, mask, "random_resized_crop");
    const auto window = random_resized_crop_window(image.size(1), image.size(2), size, rng, options);
    return std::pair{
        resample(cut(image, window, PadMode::reflection), size.height, size.width),
        resample_nearest(cut(mask.unsqueeze(0), window, PadMode::reflection), size.height, size.width).squeeze(0)};
  };
}

ItemTransform resize(ImageSize size, ResizeMethod method, PadMode padding) {
  check_size(size, "resize");
  return [size, method, padding](const at::Tensor& image, at::Generator* rng) {
    return resize_image(image, size, method, rng, padding);
  };
}

ItemTransform resize(std::int64_t size, ResizeMethod method, PadMode padding) {
  return resize(ImageSize{size, size}, method, padding);
}

ItemTransform random_resized_crop(ImageSize size, RandomResizedCropOptions options) {
  check_size(size, "random_resized_crop");
  return [size, options](const at::Tensor& image, at::Generator* rng) {
    return random_resized_crop(image, size, rng, options);
  };
}

ItemTransform random_resized_crop(std::int64_t size, RandomResizedCropOptions options) {
  return random_resized_crop(ImageSize{size, size}, options);
}

}  // namespace fastlearn
