#pragma once
// Images back to files a person can open: PNG through libspng (the inverse of image_decode for uint8).
#include <ATen/core/Tensor.h>

#include <string>

namespace fastlearn {

/// The PNG file of a uint8 image shaped (C, H, W) with 1 (gray) or 3 (RGB) channels, as bytes; other
/// shapes or types are a DataError.
std::string encode_png(const at::Tensor& image);

}  // namespace fastlearn
