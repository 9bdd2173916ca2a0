#include <fastlearn/data/image_decode.h>

#include <fastlearn/core/detail/text.h>
#include <fastlearn/core/error.h>
#include <fmt/format.h>
#include <spng.h>
#include <torch/torch.h>
#include <turbojpeg.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <functional>
#include <iterator>
#include <limits>
#include <memory>
#include <vector>

namespace fastlearn {

namespace {

[[noreturn]] void fail(std::string_view origin, std::string_view what) {
  throw DataError(fmt::format("{}: {}", excerpt(origin, 256), what));
}

void check_pixels(std::int64_t width, std::int64_t height, const DecodeOptions& options, std::string_view origin) {
  if (width <= 0 || height <= 0) fail(origin, fmt::format("the image claims {}x{} pixels", width, height));
  if (width * height > options.max_pixels) {
    fail(origin, fmt::format("{}x{} pixels is more than the limit of {} (DecodeOptions::max_pixels)", width, height,
                             options.max_pixels));
  }
}

// Gives the (height, width, channels) uint8 tensor a decoder writes into.
using PixelMemory = std::function<at::Tensor(std::int64_t height, std::int64_t width, std::int64_t channels)>;

PixelMemory fresh_pixels() {
  return [](std::int64_t h, std::int64_t w, std::int64_t c) { return torch::empty({h, w, c}, torch::kUInt8); };
}

PixelMemory reused_pixels(std::vector<std::uint8_t>& memory) {
  return [&memory](std::int64_t h, std::int64_t w, std::int64_t c) {
    memory.resize(static_cast<std::size_t>(h * w * c));
    return torch::from_blob(memory.data(), {h, w, c}, torch::kUInt8);
  };
}

// (H, W, channels) interleaved uint8 -> (C, H, W) in `mode`, a view where no conversion is needed; gray from
// RGB is ITU-R 601 luma, rounded.
at::Tensor to_chw_view(at::Tensor hwc, ImageMode mode) {
  if (mode == ImageMode::gray && hwc.size(2) >= 3) {
    auto rgb = hwc.slice(2, 0, 3).to(at::kInt);
    auto luma = (rgb.select(2, 0) * 299 + rgb.select(2, 1) * 587 + rgb.select(2, 2) * 114 + 500) / 1000;
    return luma.to(at::kByte).unsqueeze(0).contiguous();
  }
  if (mode == ImageMode::rgb && hwc.size(2) >= 3) hwc = hwc.slice(2, 0, 3);
  return hwc.permute({2, 0, 1});
}

// Whether the JPEG has Adobe's APP14 marker: Adobe's applications, which write nearly every CMYK JPEG, store the
// inks inverted (255 = no ink), and readers (libjpeg's saw_Adobe_marker, PIL's "CMYK;I") go by that marker.
bool has_adobe_marker(std::span<const std::uint8_t> bytes) {
  std::size_t at = 2;  // after SOI
  while (at + 4 <= bytes.size()) {
    if (bytes[at] != 0xFF) return false;
    const std::uint8_t marker = bytes[at + 1];
    if (marker == 0xFF) {  // fill byte
      ++at;
      continue;
    }
    if (marker == 0xDA || marker == 0xD9) return false;  // the scan (or the end) starts: no more markers
    const std::size_t length = static_cast<std::size_t>(bytes[at + 2]) << 8 | bytes[at + 3];
    constexpr std::array<std::uint8_t, 5> adobe{'A', 'd', 'o', 'b', 'e'};
    if (marker == 0xEE && length >= 2 + adobe.size() && at + 4 + adobe.size() <= bytes.size() &&
        std::equal(adobe.begin(), adobe.end(), bytes.begin() + static_cast<std::ptrdiff_t>(at + 4)))
      return true;
    at += 2 + length;
  }
  return false;
}

// x * y / 255, rounded, in integers (PIL's MULDIV255), so that RGB from CMYK is PIL's to the bit.
int muldiv255(int x, int y) {
  const int t = x * y + 128;
  return ((t >> 8) + t) >> 8;
}

// Interleaved CMYK -> interleaved RGB as PIL converts it: each channel is (255 - K) - (255 - K) * ink / 255.
void cmyk_to_rgb(const std::uint8_t* cmyk, std::uint8_t* rgb, std::int64_t pixels, bool inverted) {
  for (std::int64_t i = 0; i < pixels; ++i, cmyk += 4, rgb += 3) {
    const int k = inverted ? 255 - cmyk[3] : cmyk[3];
    const int no_black = 255 - k;
    for (int c = 0; c < 3; ++c) {
      const int ink = inverted ? 255 - cmyk[c] : cmyk[c];
      rgb[c] = static_cast<std::uint8_t>(std::clamp(no_black - muldiv255(ink, no_black), 0, 255));
    }
  }
}

at::Tensor decode_jpeg(std::span<const std::uint8_t> bytes, std::string_view origin, const DecodeOptions& options,
                       const PixelMemory& memory) {
  std::unique_ptr<void, int (*)(tjhandle)> handle(tjInitDecompress(), tjDestroy);
  if (!handle) fail(origin, "libjpeg-turbo could not start a decoder");
  auto error = [&] { return std::string(tjGetErrorStr2(handle.get())); };
  int width = 0, height = 0, subsampling = 0, colorspace = 0;
  if (tjDecompressHeader3(handle.get(), bytes.data(), static_cast<unsigned long>(bytes.size()), &width, &height,
                          &subsampling, &colorspace) != 0) {
    fail(origin, "not a readable JPEG: " + error());
  }
  check_pixels(width, height, options, origin);
  // libjpeg-turbo decodes CMYK (and YCCK) only to CMYK: the inks come out, and become RGB here.
  const bool cmyk = colorspace == TJCS_CMYK || colorspace == TJCS_YCCK;
  // The smallest scale whose result still has both sides >= min_side.
  int scaled_w = width, scaled_h = height;
  if (options.min_side > 0) {
    int n = 0;
    const tjscalingfactor* factors = tjGetScalingFactors(&n);
    for (int i = 0; i < n; ++i) {
      const int w = TJSCALED(width, factors[i]), h = TJSCALED(height, factors[i]);
      if (w >= options.min_side && h >= options.min_side && static_cast<std::int64_t>(w) * h < scaled_w * scaled_h) {
        scaled_w = w, scaled_h = h;
      }
    }
  }
  // Warnings (a truncated file, corrupt data) are errors: a partly grey image must not train silently.
  auto decompress = [&](std::uint8_t* out, int pixel_format) {
    if (tjDecompress2(handle.get(), bytes.data(), static_cast<unsigned long>(bytes.size()), out, scaled_w, 0, scaled_h,
                      pixel_format, TJFLAG_STOPONWARNING) != 0) {
      fail(origin, "corrupt JPEG: " + error());
    }
  };
  if (cmyk) {
    std::vector<std::uint8_t> inks(static_cast<std::size_t>(scaled_h) * scaled_w * 4);
    decompress(inks.data(), TJPF_CMYK);
    auto hwc = memory(scaled_h, scaled_w, 3);  // gray: luma of this RGB, as for any colour JPEG
    cmyk_to_rgb(inks.data(), hwc.data_ptr<std::uint8_t>(), static_cast<std::int64_t>(scaled_h) * scaled_w,
                has_adobe_marker(bytes));
    return to_chw_view(hwc, options.mode);
  }
  const bool gray = options.mode == ImageMode::gray;
  auto hwc = memory(scaled_h, scaled_w, gray ? 1 : 3);
  decompress(hwc.data_ptr<std::uint8_t>(), gray ? TJPF_GRAY : TJPF_RGB);
  return to_chw_view(hwc, options.mode);
}

// A libspng decoder over `bytes` with its header read; `check` fails naming `origin`.
struct PngReader {
  std::unique_ptr<spng_ctx, void (*)(spng_ctx*)> ctx{spng_ctx_new(0), spng_ctx_free};
  spng_ihdr ihdr{};
  std::string_view origin;

  PngReader(std::span<const std::uint8_t> bytes, std::string_view origin_) : origin(origin_) {
    if (!ctx) fail(origin, "libspng could not start a decoder");
    check(spng_set_crc_action(ctx.get(), SPNG_CRC_ERROR, SPNG_CRC_ERROR), "options");
    check(spng_set_chunk_limits(ctx.get(), 64 << 20, 64 << 20), "options");
    check(spng_set_png_buffer(ctx.get(), bytes.data(), bytes.size()), "buffer");
    check(spng_get_ihdr(ctx.get(), &ihdr), "header");
  }
  void check(int status, const char* what) const {
    if (status != 0) fail(origin, fmt::format("corrupt PNG ({}): {}", what, spng_strerror(status)));
  }
};

constexpr std::array<std::uint8_t, 3> kJpegMagic{0xFF, 0xD8, 0xFF};
constexpr std::array<std::uint8_t, 8> kPngMagic{0x89, 'P', 'N', 'G', '\r', '\n', 0x1A, '\n'};

template <std::size_t N>
bool starts_with(std::span<const std::uint8_t> bytes, const std::array<std::uint8_t, N>& magic) {
  return bytes.size() >= magic.size() && std::equal(magic.begin(), magic.end(), bytes.begin());
}

at::Tensor decode_png(std::span<const std::uint8_t> bytes, std::string_view origin, const DecodeOptions& options,
                      const PixelMemory& memory) {
  PngReader png(bytes, origin);
  check_pixels(png.ihdr.width, png.ihdr.height, options, origin);
  std::size_t size = 0;
  // RGBA8 is the one output every PNG colour type and depth converts to (16-bit samples are scaled).
  png.check(spng_decoded_image_size(png.ctx.get(), SPNG_FMT_RGBA8, &size), "size");
  auto hwc = memory(png.ihdr.height, png.ihdr.width, 4);
  if (size != static_cast<std::size_t>(hwc.numel())) fail(origin, "the decoded size does not match the header");
  png.check(spng_decode_image(png.ctx.get(), hwc.data_ptr<std::uint8_t>(), size, SPNG_FMT_RGBA8, SPNG_DECODE_TRNS),
            "data");
  return to_chw_view(hwc, options.mode);
}

at::Tensor decode_any(std::span<const std::uint8_t> bytes, std::string_view origin, const DecodeOptions& options,
                      const PixelMemory& memory) {
  if (starts_with(bytes, kJpegMagic)) return decode_jpeg(bytes, origin, options, memory);
  if (starts_with(bytes, kPngMagic)) return decode_png(bytes, origin, options, memory);
  fail(origin, bytes.empty() ? "the file is empty" : "neither a JPEG nor a PNG file (by its first bytes)");
}

// Reads all of `file` into `bytes` (resized to fit).
// Reads `file` into `bytes` (resized to fit), or only its first `limit` bytes; true when the whole file was read.
bool read_file(const std::filesystem::path& file, std::vector<std::uint8_t>& bytes,
               std::streamoff limit = std::numeric_limits<std::streamoff>::max()) {
  // A folder opens as a stream on Linux and tells a meaningless size.
  std::error_code error;
  if (std::filesystem::is_directory(file, error)) fail(file.string(), "a folder, not an image file");
  std::ifstream in(file, std::ios::binary | std::ios::ate);
  if (!in) fail(file.string(), fmt::format("cannot open: {}", std::strerror(errno)));
  const auto size = static_cast<std::streamoff>(in.tellg());
  if (size < 0) fail(file.string(), "cannot tell its size");
  const auto wanted = std::min(size, limit);
  bytes.resize(static_cast<std::size_t>(wanted));
  in.seekg(0);
  if (!in.read(reinterpret_cast<char*>(bytes.data()), wanted)) fail(file.string(), "read error");
  return wanted == size;
}

}  // namespace

ImageSize read_image_size(const std::filesystem::path& file) {
  // The headers lie in the first bytes: a PNG's IHDR at byte 16, a JPEG's frame header after its metadata (which
  // rarely runs past 64 KiB; when it does, the whole file is read).
  constexpr std::streamoff kHeaderBytes = 64 << 10;
  std::vector<std::uint8_t> bytes;
  const bool whole = read_file(file, bytes, kHeaderBytes);
  const auto origin = file.string();
  if (starts_with(bytes, kPngMagic)) {
    PngReader png(bytes, origin);
    return {png.ihdr.height, png.ihdr.width};
  }
  if (starts_with(bytes, kJpegMagic)) {
    std::unique_ptr<void, int (*)(tjhandle)> handle(tjInitDecompress(), tjDestroy);
    if (!handle) fail(origin, "libjpeg-turbo could not start a decoder");
    int width = 0, height = 0, subsampling = 0, colorspace = 0;
    auto header = [&] {
      return tjDecompressHeader3(handle.get(), bytes.data(), static_cast<unsigned long>(bytes.size()), &width, &height,
                                 &subsampling, &colorspace) == 0;
    };
    bool read = header();
    if (!read && !whole) {
      read_file(file, bytes);
      read = header();
    }
    if (!read) fail(origin, fmt::format("not a readable JPEG: {}", tjGetErrorStr2(handle.get())));
    return {height, width};
  }
  fail(origin, bytes.empty() ? "the file is empty" : "neither a JPEG nor a PNG file (by its first bytes)");
}

at::Tensor decode_mask(std::span<const std::uint8_t> bytes, std::string_view origin, std::int64_t max_pixels) {
  if (starts_with(bytes, kJpegMagic)) {
    fail(origin,
         "a JPEG cannot be a mask: its lossy compression changes the class values along every edge; save masks as "
         "PNG");
  }
  if (!starts_with(bytes, kPngMagic)) {
    fail(origin, bytes.empty() ? "the mask file is empty" : "not a PNG file (by its first bytes): masks are PNGs");
  }
  PngReader png(bytes, origin);
  check_pixels(png.ihdr.width, png.ihdr.height, {.max_pixels = max_pixels}, origin);
  const auto type = png.ihdr.color_type;
  const bool grey = type == SPNG_COLOR_TYPE_GRAYSCALE || type == SPNG_COLOR_TYPE_GRAYSCALE_ALPHA;
  if (!grey && type != SPNG_COLOR_TYPE_INDEXED) {
    fail(origin,
         "an RGB PNG cannot be a mask here: a mask holds one class index per pixel, as a grey or a palette PNG");
  }
  // SPNG_FMT_PNG keeps the file's own samples: palette indices unexpanded, 16-bit samples in host order, samples of
  // 1, 2 or 4 bits packed into bytes (most significant first; PIL writes palettes of up to 16 colours so).
  std::size_t size = 0;
  png.check(spng_decoded_image_size(png.ctx.get(), SPNG_FMT_PNG, &size), "size");
  const std::int64_t h = png.ihdr.height, w = png.ihdr.width, depth = png.ihdr.bit_depth;
  const std::int64_t channels = type == SPNG_COLOR_TYPE_GRAYSCALE_ALPHA ? 2 : 1;
  const std::int64_t row_bytes = (w * channels * depth + 7) / 8;
  if (size != static_cast<std::size_t>(h * row_bytes)) fail(origin, "the decoded size does not match the header");
  if (depth < 8) {
    std::vector<std::uint8_t> packed(size);
    png.check(spng_decode_image(png.ctx.get(), packed.data(), size, SPNG_FMT_PNG, 0), "data");
    auto values = torch::empty({h, w}, torch::kInt32);
    auto* out = values.data_ptr<std::int32_t>();
    const auto low = (1 << depth) - 1;
    for (std::int64_t y = 0; y < h; ++y) {
      const auto* row = packed.data() + y * row_bytes;
      for (std::int64_t x = 0; x < w; ++x) {
        const auto bit = x * depth;
        out[y * w + x] = (row[bit / 8] >> (8 - depth - bit % 8)) & low;
      }
    }
    return values;
  }
  auto raw = torch::empty({h, w, channels}, depth == 16 ? torch::kInt16 : torch::kUInt8);
  png.check(spng_decode_image(png.ctx.get(), raw.data_ptr(), size, SPNG_FMT_PNG, 0), "data");
  auto values = raw.select(2, 0).to(torch::kInt32);
  if (depth == 16) values.bitwise_and_(0xFFFF);  // int16 holds the 16 bits; read them unsigned
  return values;
}

at::Tensor read_mask(const std::filesystem::path& file, std::int64_t max_pixels) {
  std::vector<std::uint8_t> bytes;
  read_file(file, bytes);
  return decode_mask(bytes, file.string(), max_pixels);
}

at::Tensor decode_image(std::span<const std::uint8_t> bytes, std::string_view origin, const DecodeOptions& options) {
  return decode_any(bytes, origin, options, fresh_pixels()).contiguous();
}

at::Tensor read_image(const std::filesystem::path& file, const DecodeOptions& options) {
  std::vector<std::uint8_t> bytes;
  read_file(file, bytes);
  return decode_image(bytes, file.string(), options);
}

at::Tensor read_image_into(DecodeScratch& scratch, const std::filesystem::path& file, const DecodeOptions& options) {
  read_file(file, scratch.bytes);
  return decode_any(scratch.bytes, file.string(), options, reused_pixels(scratch.pixels));
}

}  // namespace fastlearn
