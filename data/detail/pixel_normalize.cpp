#include <fastlearn/data/detail/pixel_normalize.h>

namespace fastlearn {
namespace {

template <typename In>
void normalize_planes(const In* in, float* out, std::int64_t first, std::int64_t last, std::int64_t plane_size,
                      const PixelAffine& affine) {
  const float scale = affine.scale;
  for (std::int64_t p = first; p < last; ++p) {
    const std::int64_t c = affine.channels > 1 ? p % affine.channels : 0;
    const float mean = affine.mean[c], inv_std = affine.inv_std[c];
    const In* src = in + p * plane_size;
    float* dst = out + p * plane_size;
    for (std::int64_t i = 0; i < plane_size; ++i) {
      // Three statements, three roundings: the same as to_float's multiply, normalize's subtract and multiply.
      float value = static_cast<float>(src[i]) * scale;
      value = value - mean;
      dst[i] = value * inv_std;
    }
  }
}

}  // namespace

void normalize_pixels(const std::uint8_t* in, float* out, std::int64_t first, std::int64_t last,
                      std::int64_t plane_size, const PixelAffine& affine) {
  normalize_planes(in, out, first, last, plane_size, affine);
}

void normalize_pixels(const float* in, float* out, std::int64_t first, std::int64_t last, std::int64_t plane_size,
                      const PixelAffine& affine) {
  normalize_planes(in, out, first, last, plane_size, affine);
}

}  // namespace fastlearn
