#include <fastlearn/data/image_encode.h>

#include <fastlearn/core/error.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spng.h>
#include <torch/torch.h>

#include <memory>

namespace fastlearn {

std::string encode_png(const at::Tensor& image) {
  if (image.dim() != 3 || image.scalar_type() != at::kByte || (image.size(0) != 1 && image.size(0) != 3)) {
    throw DataError(fmt::format("encode_png: expects a uint8 image shaped (C, H, W) with 1 or 3 channels, got {} [{}]",
                                c10::toString(image.scalar_type()), fmt::join(image.sizes(), ", ")));
  }
  const auto hwc = image.detach().to(torch::kCPU).permute({1, 2, 0}).contiguous();
  std::unique_ptr<spng_ctx, void (*)(spng_ctx*)> ctx(spng_ctx_new(SPNG_CTX_ENCODER), spng_ctx_free);
  if (!ctx) throw DataError("encode_png: libspng could not start an encoder");
  auto check = [](int status, const char* what) {
    if (status != 0) throw DataError(fmt::format("encode_png: {}: {}", what, spng_strerror(status)));
  };
  check(spng_set_option(ctx.get(), SPNG_ENCODE_TO_BUFFER, 1), "options");
  spng_ihdr ihdr{};
  ihdr.width = static_cast<std::uint32_t>(image.size(2));
  ihdr.height = static_cast<std::uint32_t>(image.size(1));
  ihdr.bit_depth = 8;
  ihdr.color_type = image.size(0) == 1 ? SPNG_COLOR_TYPE_GRAYSCALE : SPNG_COLOR_TYPE_TRUECOLOR;
  check(spng_set_ihdr(ctx.get(), &ihdr), "header");
  check(spng_encode_image(ctx.get(), hwc.data_ptr<std::uint8_t>(), static_cast<std::size_t>(hwc.numel()), SPNG_FMT_PNG,
                          SPNG_ENCODE_FINALIZE),
        "encoding");
  std::size_t size = 0;
  int status = 0;
  // The buffer is libspng's, allocated with malloc; it passes to us.
  std::unique_ptr<void, void (*)(void*)> png(spng_get_png_buffer(ctx.get(), &size, &status), std::free);
  check(status, "buffer");
  return {static_cast<const char*>(png.get()), size};
}

}  // namespace fastlearn
