#include <fastlearn/data/transforms.h>

#include <fastlearn/core/error.h>
#include <fastlearn/data/buffer_pool.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/torch.h>

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

void require_images(const at::Tensor& x, const char* transform) {
  if (x.dim() != 4)
    throw DataError(fmt::format("{}: expects images shaped (N, C, H, W), got {} dimension(s)", transform, x.dim()));
}

}  // namespace

BatchTransform to_float(double scale) {
  return [scale](Batch& batch, at::Generator&) {
    auto& x = first_input(batch, "to_float");
    x = float_copy(x).mul_(scale);
  };
}

BatchTransform normalize(std::vector<double> mean, std::vector<double> std) {
  if (mean.empty() || mean.size() != std.size())
    throw DataError(
        fmt::format("normalize: {} mean(s) and {} std(s); give one of each per channel", mean.size(), std.size()));
  for (double s : std)
    if (!(s > 0)) throw DataError(fmt::format("normalize: std {} must be positive", s));
  auto mean_t = torch::tensor(mean, torch::kFloat32);
  auto inv_std_t = 1.0 / torch::tensor(std, torch::kFloat32);
  return [mean_t, inv_std_t](Batch& batch, at::Generator&) {
    auto& x = first_input(batch, "normalize");
    const auto channels = mean_t.numel();
    if (channels > 1 && (x.dim() < 2 || x.size(1) != channels))
      throw DataError(
          fmt::format("normalize: {} channel statistics for input shaped {}", channels, fmt::join(x.sizes(), "x")));
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

BatchTransform random_flip(double p) {
  if (p < 0 || p > 1) throw DataError(fmt::format("random_flip: probability {} is outside [0, 1]", p));
  return [p](Batch& batch, at::Generator& rng) {
    auto& x = first_input(batch, "random_flip");
    require_images(x, "random_flip");
    auto flip = at::rand({x.size(0)}, rng, torch::TensorOptions().dtype(torch::kFloat64)).lt(p);
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

}  // namespace fastlearn
