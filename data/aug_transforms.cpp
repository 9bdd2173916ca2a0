#include <fastlearn/data/aug_transforms.h>

#include <fastlearn/core/error.h>
#include <fmt/format.h>
#include <torch/torch.h>

#include <cmath>
#include <numbers>

namespace fastlearn {
namespace {

// Per image: a homography taking output coordinates (normalized to [-1, 1]) to input coordinates.
at::Tensor geometry(std::int64_t n, const AugOptions& o, at::Generator& rng) {
  const auto dbl = at::TensorOptions().dtype(at::kDouble);
  auto u = at::rand({n, 7}, rng, dbl);
  const auto on = u.select(1, 0).lt(o.p_affine).to(at::kDouble);
  const auto angle = (u.select(1, 1) * 2 - 1) * (o.max_rotate * std::numbers::pi / 180) * on;
  const auto zoom = 1 + (o.min_zoom + u.select(1, 2) * (o.max_zoom - o.min_zoom) - 1) * on;
  // Zooming in by z leaves a window of 2/z; its centre may lie anywhere that keeps it inside the image.
  const auto room = 1 - 1 / zoom;
  const auto cx = (u.select(1, 3) * 2 - 1) * room, cy = (u.select(1, 4) * 2 - 1) * room;
  const auto mx = (u.select(1, 5) * 2 - 1) * o.max_warp * on, my = (u.select(1, 6) * 2 - 1) * o.max_warp * on;

  // Affine part: input = centre + R(angle) * output / zoom.
  auto affine = torch::zeros({n, 3, 3}, dbl);
  const auto c = torch::cos(angle) / zoom, s = torch::sin(angle) / zoom;
  affine.select(1, 0).select(1, 0).copy_(c);
  affine.select(1, 0).select(1, 1).copy_(-s);
  affine.select(1, 0).select(1, 2).copy_(cx);
  affine.select(1, 1).select(1, 0).copy_(s);
  affine.select(1, 1).select(1, 1).copy_(c);
  affine.select(1, 1).select(1, 2).copy_(cy);
  affine.select(1, 2).select(1, 2).fill_(1);

  // Perspective part: the corners (-1,-1) (1,-1) (-1,1) (1,1) go to themselves moved by the warp; the
  // homography through those four pairs (8 equations) is solved per image.
  const double sx[4] = {-1, 1, -1, 1}, sy[4] = {-1, -1, 1, 1};
  auto a = torch::zeros({n, 8, 8}, dbl), b = torch::zeros({n, 8}, dbl);
  for (int k = 0; k < 4; ++k) {
    // Top corners move in by mx (the top edge narrows), left corners in by my (the left edge shortens).
    const auto dx = k < 2 ? mx * -sx[k] : torch::zeros_like(mx);
    const auto dy = k % 2 == 0 ? my * -sy[k] : torch::zeros_like(my);
    const auto tx = sx[k] + dx, ty = sy[k] + dy;
    auto row_x = a.select(1, 2 * k), row_y = a.select(1, 2 * k + 1);
    row_x.select(1, 0).fill_(sx[k]);
    row_x.select(1, 1).fill_(sy[k]);
    row_x.select(1, 2).fill_(1);
    row_x.select(1, 6).copy_(-tx * sx[k]);
    row_x.select(1, 7).copy_(-tx * sy[k]);
    row_y.select(1, 3).fill_(sx[k]);
    row_y.select(1, 4).fill_(sy[k]);
    row_y.select(1, 5).fill_(1);
    row_y.select(1, 6).copy_(-ty * sx[k]);
    row_y.select(1, 7).copy_(-ty * sy[k]);
    b.select(1, 2 * k).copy_(tx);
    b.select(1, 2 * k + 1).copy_(ty);
  }
  const auto h8 = at::linalg_solve(a, b);
  auto perspective = torch::cat({h8, torch::ones({n, 1}, dbl)}, 1).view({n, 3, 3});
  return torch::matmul(affine, perspective);
}

}  // namespace

BatchTransform aug_transforms(AugOptions o, bool masks) {
  if (o.max_rotate < 0 || o.min_zoom <= 0 || o.max_zoom < o.min_zoom || o.max_warp < 0 || o.max_warp >= 1 ||
      o.p_affine < 0 || o.p_affine > 1 || o.max_lighting < 0 || o.max_lighting >= 1 || o.p_lighting < 0 ||
      o.p_lighting > 1) {
    throw ConfigError(
        fmt::format("aug_transforms: options out of range (max_rotate {} >= 0, 0 < min_zoom {} <= "
                    "max_zoom {}, max_warp {} and max_lighting {} in [0, 1), probabilities {} and {} "
                    "in [0, 1])",
                    o.max_rotate, o.min_zoom, o.max_zoom, o.max_warp, o.max_lighting, o.p_affine, o.p_lighting));
  }
  return [o, masks](Batch& batch, at::Generator& rng) {
    if (batch.inputs.empty()) throw DataError("aug_transforms: the batch has no input tensor");
    auto& x = batch.inputs.front();
    if (x.dim() != 4 || !x.is_floating_point()) {
      throw DataError("aug_transforms: expects float images shaped (N, C, H, W) in [0, 1] (put it after to_float)");
    }
    const auto n = x.size(0), h = x.size(2), w = x.size(3);
    if (masks && (batch.targets.empty() || batch.targets.front().dim() != 3 || batch.targets.front().size(0) != n ||
                  batch.targets.front().size(1) != h || batch.targets.front().size(2) != w)) {
      throw DataError("aug_transforms: asked to move masks, but target 0 is not the (N, H, W) masks of the images");
    }
    if (n == 0) return;
    // The output pixel grid in [-1, 1] (corners aligned), through each image's homography.
    const auto dbl = at::TensorOptions().dtype(at::kDouble);
    const auto ys = torch::linspace(-1, 1, h, dbl), xs = torch::linspace(-1, 1, w, dbl);
    const auto grid =
        torch::stack({xs.view({1, w}).expand({h, w}), ys.view({h, 1}).expand({h, w}), torch::ones({h, w}, dbl)}, -1)
            .view({1, h * w, 3});
    const auto mapped = torch::matmul(grid, geometry(n, o, rng).transpose(1, 2));  // (n, h*w, 3)
    const auto xy = (mapped.narrow(2, 0, 2) / mapped.narrow(2, 2, 1)).view({n, h, w, 2});
    const auto sample_at = xy.to(x.scalar_type()).to(x.device());
    x = at::grid_sampler(x, sample_at, /*bilinear*/ 0, /*reflection*/ 2, /*align_corners=*/true);
    if (masks) {
      // The masks by the same grid and padding, nearest: every output pixel takes the class under its sample point.
      auto& m = batch.targets.front();
      const auto moved = at::grid_sampler(m.unsqueeze(1).to(x.scalar_type()), sample_at, /*nearest*/ 1,
                                          /*reflection*/ 2, /*align_corners=*/true);
      m = moved.squeeze(1).round().to(m.scalar_type());
    }
    // Lighting in logit space, as fastai: brightness adds logit(b), contrast multiplies by c.
    auto u = at::rand({n, 3}, rng, dbl);
    const auto on = u.select(1, 0).lt(o.p_lighting).to(at::kDouble);
    const auto bright = 0.5 * (1 - o.max_lighting) + u.select(1, 1) * o.max_lighting;
    const double log_lo = std::log(1 - o.max_lighting), log_hi = -std::log(1 - o.max_lighting);
    const auto contrast = torch::exp(log_lo + u.select(1, 2) * (log_hi - log_lo));
    const auto shift = (torch::logit(bright) * on).view({n, 1, 1, 1}).to(x.scalar_type()).to(x.device());
    const auto scale = (1 + (contrast - 1) * on).view({n, 1, 1, 1}).to(x.scalar_type()).to(x.device());
    const auto eps = 1e-6;  // keeps logit finite at 0 and 1
    const auto lit = torch::sigmoid(torch::logit(x.clamp(eps, 1 - eps)) * scale + shift);
    x = torch::where(on.gt(0).view({n, 1, 1, 1}).to(x.device()), lit, x);  // the others stay exactly as they were
  };
}

}  // namespace fastlearn
