#include <fastlearn/data/transforms.h>

#include <ATen/Parallel.h>
#include <fastlearn/core/error.h>
#include <fastlearn/data/detail/buffer_pool.h>
#include <fastlearn/data/detail/pixel_normalize.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/torch.h>

#include <algorithm>

namespace fastlearn {
namespace {

at::Tensor& first_input(Batch& batch, const char* transform) {
  if (batch.inputs.empty()) throw DataError(fmt::format("{}: the batch has no input tensor", transform));
  return batch.inputs.front();
}

// Uninitialized memory shaped and laid out as `x`: batch memory (see buffer_pool.h) when x is contiguous.
at::Tensor fresh_like(const at::Tensor& x, at::ScalarType dtype) {
  if (!x.is_contiguous()) return at::empty_like(x, x.options().dtype(dtype));
  return pooled_empty(x.sizes(), x.options().dtype(dtype));
}

// A float32 copy of `x`: one pass, and no fresh pages for the kernel to zero.
at::Tensor float_copy(const at::Tensor& x) { return fresh_like(x, torch::kFloat32).copy_(x); }

void check_statistics(const std::vector<double>& mean, const std::vector<double>& std) {
  if (mean.empty() || mean.size() != std.size())
    throw DataError(
        fmt::format("normalize: {} mean(s) and {} std(s); give one of each per channel", mean.size(), std.size()));
  for (double s : std)
    if (!(s > 0)) throw DataError(fmt::format("normalize: std {} must be positive", s));
}

void check_channels(const at::Tensor& x, std::int64_t channels, const char* transform) {
  if (channels > 1 && (x.dim() < 2 || x.size(1) != channels))
    throw DataError(
        fmt::format("{}: {} channel statistics for input shaped {}", transform, channels, fmt::join(x.sizes(), "x")));
}

// A task of the one-pass normalization converts at least this many values (a thread's start costs about as
// much as converting a few thousand). Today the tasks run one after the other on the calling thread:
// at::parallel_for is OpenMP inlined from ATen's headers, and fastlearn is not compiled with OpenMP (clang's
// -fopenmp would bring a second runtime beside LibTorch's libgomp). core/detail/parallel.h runs loops on LibTorch's
// team; it is not used here yet because loader workers call this transform, each of which would then start a
// team of its own on cores the other workers keep busy (not measured).
constexpr std::int64_t kValuesPerTask = std::int64_t{1} << 16;

void require_images(const at::Tensor& x, const char* transform) {
  if (x.dim() != 4)
    throw DataError(fmt::format("{}: expects images shaped (N, C, H, W), got {} dimension(s)", transform, x.dim()));
}

// With `masks`, target 0: the (N, H, W) masks of the (N, C, H, W) images `x`; null without.
at::Tensor* masks_of(Batch& batch, const at::Tensor& x, bool masks, const char* transform) {
  if (!masks) return nullptr;
  if (batch.targets.empty())
    throw DataError(fmt::format("{}: asked to move masks, but the batch has no target", transform));
  auto& m = batch.targets.front();
  if (m.dim() != 3 || m.size(0) != x.size(0) || m.size(1) != x.size(2) || m.size(2) != x.size(3)) {
    throw DataError(fmt::format("{}: target 0 is [{}], not the (N, H, W) masks of images [{}]", transform,
                                fmt::join(m.sizes(), ", "), fmt::join(x.sizes(), ", ")));
  }
  return &m;
}

}  // namespace

BatchTransform to_float(double scale) {
  return [scale](Batch& batch, at::Generator&) {
    auto& x = first_input(batch, "to_float");
    x = float_copy(x).mul_(scale);
  };
}

BatchTransform normalize(std::vector<double> mean, std::vector<double> std) {
  check_statistics(mean, std);
  auto mean_t = torch::tensor(mean, torch::kFloat32);
  auto inv_std_t = 1.0 / torch::tensor(std, torch::kFloat32);
  return [mean_t, inv_std_t](Batch& batch, at::Generator&) {
    auto& x = first_input(batch, "normalize");
    const auto channels = mean_t.numel();
    check_channels(x, channels, "normalize");
    std::vector<std::int64_t> shape(x.dim(), 1);
    if (x.dim() >= 2) shape[1] = channels;
    const auto on = x.options().dtype(x.is_floating_point() ? x.scalar_type() : torch::kFloat32);
    // Into fresh batch memory: x may be a view of the dataset's own tensor.
    const auto channel_mean = mean_t.to(on).view(shape);
    at::Tensor out;
    if (x.is_floating_point()) {
      out = fresh_like(x, x.scalar_type());
      at::sub_out(out, x, channel_mean);
    } else {
      out = float_copy(x).sub_(channel_mean);
    }
    x = out.mul_(inv_std_t.to(on).view(shape));
  };
}

BatchTransform to_normalized_float(double scale, std::vector<double> mean, std::vector<double> std) {
  check_statistics(mean, std);
  // The constants as the two transforms round them: the scale to float by mul_, 1/std in float32.
  std::vector<float> mean_f(mean.begin(), mean.end()), inv_std_f;
  for (double s : std) inv_std_f.push_back(1.0f / static_cast<float>(s));
  const float scale_f = static_cast<float>(scale);
  const BatchTransform as_float = to_float(scale);
  const BatchTransform normalized = normalize(std::move(mean), std::move(std));
  return [as_float, normalized, mean_f, inv_std_f, scale_f](Batch& batch, at::Generator& rng) {
    auto& x = first_input(batch, "to_normalized_float");
    const auto channels = static_cast<std::int64_t>(mean_f.size());
    check_channels(x, channels, "to_normalized_float");
    const bool one_pass = x.is_cpu() && x.is_contiguous() && x.dim() >= 1 &&
                          (x.scalar_type() == torch::kByte || x.scalar_type() == torch::kFloat32);
    if (!one_pass) {
      as_float(batch, rng);
      return normalized(batch, rng);
    }
    // Planes of (N, C, ...): channel c's statistics apply to plane p when p % C == c.
    const std::int64_t planes = x.dim() >= 2 ? x.size(0) * x.size(1) : 1;
    const std::int64_t plane_size = planes ? x.numel() / planes : 0;
    auto out = fresh_like(x, torch::kFloat32);
    const PixelAffine affine{
        .scale = scale_f, .mean = mean_f.data(), .inv_std = inv_std_f.data(), .channels = channels};
    const std::int64_t grain = std::max<std::int64_t>(1, kValuesPerTask / std::max<std::int64_t>(plane_size, 1));
    at::parallel_for(0, planes, grain, [&](std::int64_t first, std::int64_t last) {
      if (x.scalar_type() == torch::kByte) {
        normalize_pixels(x.const_data_ptr<std::uint8_t>(), out.mutable_data_ptr<float>(), first, last, plane_size,
                         affine);
      } else {
        normalize_pixels(x.const_data_ptr<float>(), out.mutable_data_ptr<float>(), first, last, plane_size, affine);
      }
    });
    x = out;
  };
}

BatchTransform random_crop(std::int64_t size, std::int64_t padding) {
  if (size <= 0 || padding < 0)
    throw DataError(fmt::format("random_crop: size {} and padding {} are invalid", size, padding));
  return [size, padding](Batch& batch, at::Generator& rng) {
    auto& x = first_input(batch, "random_crop");
    require_images(x, "random_crop");
    auto padded = padding ? torch::constant_pad_nd(x, {padding, padding, padding, padding}, 0) : x;
    const auto max_y = padded.size(2) - size, max_x = padded.size(3) - size;
    if (max_y < 0 || max_x < 0)
      throw DataError(
          fmt::format("random_crop: crop {} exceeds the padded image {}x{}", size, padded.size(2), padded.size(3)));
    auto ys = at::randint(max_y + 1, {x.size(0)}, rng, torch::kLong);
    auto xs = at::randint(max_x + 1, {x.size(0)}, rng, torch::kLong);
    auto out = pooled_empty({x.size(0), x.size(1), size, size}, x.options());
    const auto* y0 = ys.data_ptr<std::int64_t>();
    const auto* x0 = xs.data_ptr<std::int64_t>();
    for (std::int64_t i = 0; i < x.size(0); ++i) out[i].copy_(padded[i].narrow(1, y0[i], size).narrow(2, x0[i], size));
    x = out;
  };
}

BatchTransform random_flip(double p, bool masks) {
  if (p < 0 || p > 1) throw DataError(fmt::format("random_flip: probability {} is outside [0, 1]", p));
  return [p, masks](Batch& batch, at::Generator& rng) {
    auto& x = first_input(batch, "random_flip");
    require_images(x, "random_flip");
    auto* m = masks_of(batch, x, masks, "random_flip");
    auto flip = at::rand({x.size(0)}, rng, torch::TensorOptions().dtype(torch::kFloat64)).lt(p);
    if (m) *m = torch::where(flip.view({-1, 1, 1}).to(m->device()), m->flip({2}), *m);
    if (!x.is_cpu()) {
      x = torch::where(flip.view({-1, 1, 1, 1}).to(x.device()), x.flip({3}), x);
      return;
    }
    // Image by image into batch memory: a third of the passes and none of the allocations of where().
    auto out = fresh_like(x, x.scalar_type());
    const auto* flipped = flip.data_ptr<bool>();
    for (std::int64_t i = 0; i < x.size(0); ++i) out[i].copy_(flipped[i] ? x[i].flip({2}) : x[i]);
    x = out;
  };
}

BatchTransform dihedral(double p, bool masks) {
  if (p < 0 || p > 1) throw DataError(fmt::format("dihedral: probability {} is outside [0, 1]", p));
  return [p, masks](Batch& batch, at::Generator& rng) {
    auto& x = first_input(batch, "dihedral");
    require_images(x, "dihedral");
    if (x.size(2) != x.size(3)) {
      throw DataError(fmt::format(
          "dihedral: images are {}x{}; the square's symmetries keep only square images whole (use random_flip)",
          x.size(2), x.size(3)));
    }
    auto* m = masks_of(batch, x, masks, "dihedral");
    const auto n = x.size(0);
    auto draws = at::rand({n, 2}, rng, torch::TensorOptions().dtype(torch::kFloat64));
    auto on = draws.select(1, 0).lt(p);
    auto which = draws.select(1, 1).mul(8).floor().clamp_max(7).to(torch::kLong);
    const auto* apply = on.data_ptr<bool>();
    const auto* k = which.data_ptr<std::int64_t>();
    // Symmetry k: bit 0 flips left-right, bit 1 top-bottom, bit 2 transposes (after the flips).
    auto move = [](const at::Tensor& t, std::int64_t k, std::int64_t h_dim) {
      auto y = t;
      if (k & 1) y = y.flip({h_dim + 1});
      if (k & 2) y = y.flip({h_dim});
      if (k & 4) y = y.transpose(h_dim, h_dim + 1);
      return y;
    };
    auto out = at::empty_like(x, at::MemoryFormat::Contiguous);
    auto out_masks = m ? at::empty_like(*m, at::MemoryFormat::Contiguous) : at::Tensor();
    for (std::int64_t i = 0; i < n; ++i) {
      const auto symmetry = apply[i] ? k[i] : 0;
      out[i].copy_(move(x[i], symmetry, 1));
      if (m) out_masks[i].copy_(move((*m)[i], symmetry, 0));
    }
    x = out;
    if (m) *m = out_masks;
  };
}

}  // namespace fastlearn
