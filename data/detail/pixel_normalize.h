#pragma once
// The arithmetic of to_float followed by normalize, in one pass over a batch: each value becomes
// ((float)x * scale - mean[c]) * inv_std[c], rounded to float after each step as the two transforms round it,
// so the values are the same bit for bit (this file is compiled without floating-point contraction).
// Plain pointers and no LibTorch: transforms.cpp picks the planes and the threads.
#include <cstdint>

namespace fastlearn {

/// Per-channel constants, already in float. `mean` and `inv_std` hold `channels` values; with 1 channel they
/// apply to every plane.
struct PixelAffine {
  float scale = 1.0f;
  const float* mean = nullptr;
  const float* inv_std = nullptr;
  std::int64_t channels = 1;
};

/// Planes [first, last) of a contiguous (N, C, ...) batch, `plane_size` values each; plane p is channel
/// p % channels.
void normalize_pixels(const std::uint8_t* in, float* out, std::int64_t first, std::int64_t last,
                      std::int64_t plane_size, const PixelAffine& affine);
void normalize_pixels(const float* in, float* out, std::int64_t first, std::int64_t last, std::int64_t plane_size,
                      const PixelAffine& affine);

}  // namespace fastlearn
