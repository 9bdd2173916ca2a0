// libFuzzer target: decode_image on arbitrary bytes, in RGB and gray mode and with scaled JPEG decoding. Any
// input must give a uint8 (C, H, W) tensor with C = 3 (1 in gray mode) within the pixel limit, or a
// fastlearn::DataError; a crash, a sanitizer report, a leak or another exception type is a bug.
#include <fastlearn/core/error.h>
#include <fastlearn/data/image_decode.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <span>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::span<const std::uint8_t> bytes(data, size);
  for (const auto& options :
       {fastlearn::DecodeOptions{.max_pixels = 1 << 20},
        fastlearn::DecodeOptions{.mode = fastlearn::ImageMode::gray, .min_side = 8, .max_pixels = 1 << 20}}) {
    try {
      const auto image = fastlearn::decode_image(bytes, "fuzz", options);
      const std::int64_t channels = options.mode == fastlearn::ImageMode::gray ? 1 : 3;
      if (image.dim() != 3 || image.size(0) != channels || image.scalar_type() != at::kByte) std::abort();
      if (image.size(1) * image.size(2) > options.max_pixels || !image.is_contiguous()) std::abort();
    } catch (const fastlearn::DataError&) {}
  }
  return 0;
}
