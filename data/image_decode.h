#pragma once
// Image files as tensors: JPEG through libjpeg-turbo's TurboJPEG API and PNG through libspng. Grayscale,
// RGB, RGBA, palette and 16-bit images all become uint8 (C, H, W) tensors with 3 channels (or 1 with
// ImageMode::gray), as torchvision's read_image with ImageReadMode.RGB / GRAY: alpha is dropped, 16-bit
// samples are scaled to 8 bits, gray is ITU-R 601 luma. A file that is neither, truncated or corrupt is a
// DataError naming it.
#include <fastlearn/core/image_size.h>

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <filesystem>
#include <span>
#include <string_view>
#include <vector>

namespace fastlearn {

enum class ImageMode { rgb, gray };

struct DecodeOptions {
  ImageMode mode = ImageMode::rgb;
  /// JPEG only: decode at the smallest of libjpeg-turbo's scales (1/8 .. 1) that keeps both sides at least
  /// this long (0: full size). Much faster when the training size is far below the file's.
  std::int64_t min_side = 0;
  /// Images with more pixels are refused before any allocation (a hostile header can claim anything).
  std::int64_t max_pixels = std::int64_t{1} << 28;
};

/// Decodes the bytes of a JPEG or PNG file; `origin` names it in errors.
at::Tensor decode_image(std::span<const std::uint8_t> bytes, std::string_view origin,
                        const DecodeOptions& options = {});
/// Reads and decodes `file`.
at::Tensor read_image(const std::filesystem::path& file, const DecodeOptions& options = {});

/// Memory one thread reuses from image to image: the file's bytes and the decoded pixels.
struct DecodeScratch {
  std::vector<std::uint8_t> bytes, pixels;
};

/// As read_image, without allocating: the result is a (C, H, W) view of `scratch.pixels`, held
/// channels-last (as the decoders write it), and valid only until the next call with the same scratch.
/// For loaders that transform each image into new memory at once.
at::Tensor read_image_into(DecodeScratch& scratch, const std::filesystem::path& file,
                           const DecodeOptions& options = {});

/// The height and width a JPEG or PNG file's header gives (at full scale), read without decoding the pixels.
/// DataError naming the file for anything else.
ImageSize read_image_size(const std::filesystem::path& file);

/// A segmentation mask's values as they are stored, (H, W) int32: an 8- or 16-bit grey PNG gives its samples (a grey
/// PNG with alpha its grey channel), a palette PNG its palette indices. DataError naming `origin` for a JPEG (lossy
/// compression changes the values along every edge), an RGB PNG (a colour per class needs a colour table, which masks
/// here do not take), or a file that does not decode. Refused above `max_pixels` before anything is allocated.
at::Tensor decode_mask(std::span<const std::uint8_t> bytes, std::string_view origin,
                       std::int64_t max_pixels = std::int64_t{1} << 28);
/// Reads and decodes the mask `file`.
at::Tensor read_mask(const std::filesystem::path& file, std::int64_t max_pixels = std::int64_t{1} << 28);

}  // namespace fastlearn
