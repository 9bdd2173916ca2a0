// Image decoding: JPEG and PNG files of every colour type become the same uint8 (C, H, W) tensors, and every
// broken file is an error that names it. The files are written here with the same libraries' encoders.
#include <fastlearn/core/error.h>
#include <fastlearn/data/image_decode.h>
#include <fastlearn/data/image_encode.h>

#include <gtest/gtest.h>
#include <spng.h>
#include <torch/torch.h>
#include <turbojpeg.h>

#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "support/message_of.h"

namespace fl = fastlearn;
namespace flt = fastlearn::testing;
using Bytes = std::vector<std::uint8_t>;

namespace {

// A smooth test picture (H, W, 3): JPEG keeps it within a few levels.
at::Tensor picture(std::int64_t h, std::int64_t w) {
  auto y = torch::arange(h).view({h, 1, 1}).expand({h, w, 1});
  auto x = torch::arange(w).view({1, w, 1}).expand({h, w, 1});
  return torch::cat({x * 255 / (w - 1), y * 255 / (h - 1), (x + y) * 255 / (h + w - 2)}, 2)
      .to(torch::kUInt8)
      .contiguous();
}

Bytes jpeg(const at::Tensor& hwc, bool gray, int quality = 95) {
  std::unique_ptr<void, int (*)(tjhandle)> tj(tjInitCompress(), tjDestroy);
  unsigned char* out = nullptr;
  unsigned long size = 0;
  const int h = static_cast<int>(hwc.size(0)), w = static_cast<int>(hwc.size(1));
  EXPECT_EQ(tjCompress2(tj.get(), hwc.data_ptr<std::uint8_t>(), w, 0, h, gray ? TJPF_GRAY : TJPF_RGB, &out, &size,
                        gray ? TJSAMP_GRAY : TJSAMP_444, quality, 0),
            0);
  Bytes bytes(out, out + size);
  tjFree(out);
  return bytes;
}

// A PNG of `pixels` (H, W, channels, uint8 or int16 holding 16-bit samples) with `color_type`.
Bytes png(const at::Tensor& pixels, std::uint8_t color_type, std::uint8_t depth = 8, const spng_plte* plte = nullptr) {
  std::unique_ptr<spng_ctx, void (*)(spng_ctx*)> ctx(spng_ctx_new(SPNG_CTX_ENCODER), spng_ctx_free);
  spng_set_option(ctx.get(), SPNG_ENCODE_TO_BUFFER, 1);
  spng_ihdr ihdr{.width = static_cast<std::uint32_t>(pixels.size(1)),
                 .height = static_cast<std::uint32_t>(pixels.size(0)),
                 .bit_depth = depth,
                 .color_type = color_type};
  spng_set_ihdr(ctx.get(), &ihdr);
  if (plte) spng_set_plte(ctx.get(), const_cast<spng_plte*>(plte));
  auto data = pixels.contiguous();
  EXPECT_EQ(spng_encode_image(ctx.get(), data.data_ptr(), static_cast<std::size_t>(data.nbytes()), SPNG_FMT_PNG,
                              SPNG_ENCODE_FINALIZE),
            0);
  std::size_t size = 0;
  int error = 0;
  auto* buffer = static_cast<std::uint8_t*>(spng_get_png_buffer(ctx.get(), &size, &error));
  Bytes bytes(buffer, buffer + size);
  std::free(buffer);
  return bytes;
}

at::Tensor chw(const at::Tensor& hwc) { return hwc.permute({2, 0, 1}).contiguous(); }

}  // namespace

TEST(ImageDecode, PngOfEveryColourTypeBecomesTheSameRgbTensor) {
  const auto rgb = picture(5, 7);
  EXPECT_TRUE(torch::equal(fl::decode_image(png(rgb, SPNG_COLOR_TYPE_TRUECOLOR), "rgb.png"), chw(rgb)));
  // RGBA: alpha dropped.
  auto rgba = torch::cat({rgb, torch::full({5, 7, 1}, 77, torch::kUInt8)}, 2);
  EXPECT_TRUE(torch::equal(fl::decode_image(png(rgba, SPNG_COLOR_TYPE_TRUECOLOR_ALPHA), "rgba.png"), chw(rgb)));
  // Grayscale: three equal channels; in gray mode, one.
  auto gray = rgb.slice(2, 0, 1).contiguous();
  const auto decoded = fl::decode_image(png(gray, SPNG_COLOR_TYPE_GRAYSCALE), "gray.png");
  EXPECT_TRUE(torch::equal(decoded, chw(gray).expand({3, 5, 7})));
  EXPECT_TRUE(torch::equal(
      fl::decode_image(png(gray, SPNG_COLOR_TYPE_GRAYSCALE), "g.png", {.mode = fl::ImageMode::gray}), chw(gray)));
  // 16-bit: the high byte of each sample.
  auto wide = (rgb.to(torch::kInt32) * 257).to(torch::kInt16);  // v * 257 has v in both bytes: any byte order
  EXPECT_TRUE(torch::equal(fl::decode_image(png(wide, SPNG_COLOR_TYPE_TRUECOLOR, 16), "deep.png"), chw(rgb)));
  // Palette: indices into three colours.
  spng_plte plte{.n_entries = 3};
  plte.entries[0] = {10, 20, 30, 0};
  plte.entries[1] = {40, 50, 60, 0};
  plte.entries[2] = {70, 80, 90, 0};
  auto indices = (torch::arange(35) % 3).view({5, 7, 1}).to(torch::kUInt8);
  auto expected = torch::tensor({10, 20, 30, 40, 50, 60, 70, 80, 90}, torch::kUInt8)
                      .view({3, 3})
                      .index({indices.squeeze(2).to(torch::kLong)});
  EXPECT_TRUE(
      torch::equal(fl::decode_image(png(indices, SPNG_COLOR_TYPE_INDEXED, 8, &plte), "palette.png"), chw(expected)));
}

TEST(ImageDecode, JpegRgbAndGrayDecodeCloseToTheirPixels) {
  const auto rgb = picture(32, 48);
  auto decoded = fl::decode_image(jpeg(rgb, false), "rgb.jpg");
  ASSERT_EQ(decoded.sizes(), (std::vector<std::int64_t>{3, 32, 48}));
  EXPECT_LE((decoded.to(torch::kInt) - chw(rgb).to(torch::kInt)).abs().max().item<int>(), 8);
  // A grayscale JPEG: three equal channels in rgb mode.
  auto gray = rgb.slice(2, 0, 1).contiguous();
  auto g3 = fl::decode_image(jpeg(gray, true), "gray.jpg");
  ASSERT_EQ(g3.size(0), 3);
  EXPECT_TRUE(torch::equal(g3[0], g3[1]) && torch::equal(g3[1], g3[2]));
  EXPECT_EQ(fl::decode_image(jpeg(gray, true), "gray.jpg", {.mode = fl::ImageMode::gray}).size(0), 1);
}

TEST(ImageDecode, CmykJpegsBecomeRgbAsPilConvertsThem) {
  // libjpeg-turbo writes CMYK pixels as given, with Adobe's marker: readers take them as inverted inks (255 = none).
  // Stored K = 255 (no black) and C, M, Y = the picture's R, G, B: the RGB is the picture, up to JPEG's loss.
  const auto rgb = picture(32, 48);
  const auto stored = torch::cat({rgb, torch::full({32, 48, 1}, 255, torch::kUInt8)}, 2).contiguous();
  std::unique_ptr<void, int (*)(tjhandle)> tj(tjInitCompress(), tjDestroy);
  unsigned char* out = nullptr;
  unsigned long size = 0;
  ASSERT_EQ(
      tjCompress2(tj.get(), stored.data_ptr<std::uint8_t>(), 48, 0, 32, TJPF_CMYK, &out, &size, TJSAMP_444, 95, 0), 0);
  const Bytes cmyk(out, out + size);
  tjFree(out);
  const auto decoded = fl::decode_image(cmyk, "cmyk.jpg");
  ASSERT_EQ(decoded.sizes(), (std::vector<std::int64_t>{3, 32, 48}));
  EXPECT_LE((decoded.to(torch::kInt) - chw(rgb).to(torch::kInt)).abs().max().item<int>(), 8);
  // Full black ink everywhere (stored K = 0): black, whatever the other inks.
  auto black = stored.clone();
  black.select(2, 3).fill_(0);
  out = nullptr, size = 0;  // a fresh buffer: TurboJPEG would reuse the one freed above
  ASSERT_EQ(tjCompress2(tj.get(), black.data_ptr<std::uint8_t>(), 48, 0, 32, TJPF_CMYK, &out, &size, TJSAMP_444, 95, 0),
            0);
  const Bytes black_jpeg(out, out + size);
  tjFree(out);
  EXPECT_LE(fl::decode_image(black_jpeg, "black.jpg").max().item<int>(), 4);
  EXPECT_EQ(fl::decode_image(cmyk, "cmyk.jpg", {.mode = fl::ImageMode::gray}).size(0), 1);
}

TEST(ImageDecode, JpegScaledDecodingKeepsBothSidesAtLeastMinSide) {
  const auto big = picture(400, 600);
  const auto bytes = jpeg(big, false);
  EXPECT_EQ(fl::decode_image(bytes, "big.jpg").sizes(), (std::vector<std::int64_t>{3, 400, 600}));
  // libjpeg-turbo scales by n/8: 3/8 gives 150x225, the smallest with both sides >= 128 (2/8 gives 100x150).
  auto scaled = fl::decode_image(bytes, "big.jpg", {.min_side = 128});
  EXPECT_EQ(scaled.sizes(), (std::vector<std::int64_t>{3, 150, 225}));
  EXPECT_EQ(fl::decode_image(bytes, "big.jpg", {.min_side = 401}).sizes(), (std::vector<std::int64_t>{3, 400, 600}))
      << "no scale reaches 401 without upscaling: full size";
}

TEST(ImageDecode, BrokenFilesAreErrorsThatNameThem) {
  const auto good_png = png(picture(8, 8), SPNG_COLOR_TYPE_TRUECOLOR);
  const auto good_jpeg = jpeg(picture(64, 64), false);
  auto expect_error = [](const Bytes& bytes, const std::string& needle) {
    const auto msg = flt::message_of([&] { fl::decode_image(bytes, "cat.42.img"); });
    EXPECT_NE(msg.find("cat.42.img"), std::string::npos) << msg;
    EXPECT_NE(msg.find(needle), std::string::npos) << msg;
  };
  expect_error({}, "empty");
  expect_error({'G', 'I', 'F', '8', '9', 'a'}, "neither a JPEG nor a PNG");
  expect_error(Bytes(good_png.begin(), good_png.begin() + good_png.size() / 2), "corrupt PNG");
  expect_error(Bytes(good_jpeg.begin(), good_jpeg.begin() + good_jpeg.size() / 2), "JPEG");
  auto bad_crc = good_png;
  bad_crc[40] ^= 0xFF;  // inside the image data: its CRC no longer matches
  expect_error(bad_crc, "corrupt PNG");
  // A header claiming more pixels than allowed is refused before allocating.
  const auto msg = flt::message_of([&] { fl::decode_image(good_jpeg, "huge.jpg", {.max_pixels = 100}); });
  EXPECT_NE(msg.find("limit"), std::string::npos) << msg;
  EXPECT_THROW(fl::read_image("/nonexistent/x.png"), fl::DataError);
}

TEST(ImageDecode, ReadImageReadsAFile) {
  const auto file = std::filesystem::temp_directory_path() / ("fastlearn-image-" + std::to_string(getpid()) + ".PNG");
  const auto bytes = png(picture(6, 4), SPNG_COLOR_TYPE_TRUECOLOR);
  std::ofstream(file, std::ios::binary)
      .write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  EXPECT_TRUE(torch::equal(fl::read_image(file), chw(picture(6, 4))));
  std::filesystem::remove(file);
}

TEST(ImageDecode, ReadImageIntoGivesTheSamePixelsInItsScratch) {
  const auto dir = std::filesystem::temp_directory_path() / ("fastlearn-scratch-" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  auto write = [&](const std::string& name, const Bytes& bytes) {
    std::ofstream(dir / name, std::ios::binary)
        .write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
    return dir / name;
  };
  const auto big = write("big.jpg", jpeg(picture(40, 30), false)), small = write("small.png", png(picture(6, 4), 2));
  fl::DecodeScratch scratch;
  for (const auto& file : {big, small, big}) {
    const auto view = fl::read_image_into(scratch, file);
    EXPECT_TRUE(torch::equal(view, fl::read_image(file))) << file;
    EXPECT_EQ(view.data_ptr(), static_cast<void*>(scratch.pixels.data())) << "not decoded into the scratch";
  }
  // Gray, and the scaled JPEG decoding, go through the scratch too.
  const fl::DecodeOptions gray_small{.mode = fl::ImageMode::gray, .min_side = 10};
  EXPECT_TRUE(torch::equal(fl::read_image_into(scratch, big, gray_small), fl::read_image(big, gray_small)));
  EXPECT_THROW(fl::read_image_into(scratch, dir / "missing.jpg"), fl::DataError);
  std::filesystem::remove_all(dir);
}

TEST(ImageEncode, PngRoundTripsRgbAndGrayAndRefusesOtherImages) {
  const auto rgb = picture(5, 7).permute({2, 0, 1}).contiguous();
  const auto rgb_png = fl::encode_png(rgb);
  EXPECT_EQ(rgb_png.substr(1, 3), "PNG");
  const auto rgb_bytes = std::span(reinterpret_cast<const std::uint8_t*>(rgb_png.data()), rgb_png.size());
  EXPECT_TRUE(torch::equal(fl::decode_image(rgb_bytes, "rgb.png"), rgb));
  const auto gray = rgb.narrow(0, 1, 1);  // not contiguous in memory: the encoder copies what it needs
  const auto gray_png = fl::encode_png(gray);
  const auto gray_bytes = std::span(reinterpret_cast<const std::uint8_t*>(gray_png.data()), gray_png.size());
  EXPECT_TRUE(torch::equal(fl::decode_image(gray_bytes, "gray.png", {.mode = fl::ImageMode::gray}), gray));
  EXPECT_THROW(fl::encode_png(rgb.to(torch::kFloat)), fl::DataError);
  EXPECT_THROW(fl::encode_png(torch::zeros({4, 5, 5}, torch::kUInt8)), fl::DataError);
  EXPECT_THROW(fl::encode_png(torch::zeros({5, 5}, torch::kUInt8)), fl::DataError);
}

// --- Masks: the stored values, never converted ---------------------------------------------------------------------

TEST(MaskDecode, GreyOf8And16BitsGreyWithAlphaPaletteAndLowDepthKeepTheirValues) {
  const auto values = torch::arange(12, torch::kInt32).view({3, 4});
  auto as = [](const at::Tensor& hw, at::ScalarType type) { return hw.to(type).unsqueeze(2).contiguous(); };
  const auto grey = png(as(values, torch::kUInt8), SPNG_COLOR_TYPE_GRAYSCALE);
  EXPECT_TRUE(fl::decode_mask(grey, "grey.png").equal(values));
  // 16 bits: values past 32767 stay positive
  const auto wide_values = values * 3000 + 20000;
  const auto wide = png(as(wide_values, torch::kInt16), SPNG_COLOR_TYPE_GRAYSCALE, 16);
  EXPECT_TRUE(fl::decode_mask(wide, "wide.png").equal(wide_values));
  // Grey with alpha: the grey channel
  const auto grey_alpha = png(torch::stack({values, torch::full_like(values, 255)}, 2).to(torch::kUInt8).contiguous(),
                              SPNG_COLOR_TYPE_GRAYSCALE_ALPHA);
  EXPECT_TRUE(fl::decode_mask(grey_alpha, "ga.png").equal(values));
  // A palette PNG gives its indices, whatever the colours (fastai's luminance would give 0, 76, 29 here)
  spng_plte plte{};
  plte.n_entries = 3;
  plte.entries[1] = {255, 0, 0, 0};
  plte.entries[2] = {0, 0, 255, 0};
  const auto indices = values.remainder(3);
  const auto palette = png(as(indices, torch::kUInt8), SPNG_COLOR_TYPE_INDEXED, 8, &plte);
  EXPECT_TRUE(fl::decode_mask(palette, "palette.png").equal(indices));
  // 1-bit grey, 8 pixels a byte: 0 and 1, not 0 and 255
  std::unique_ptr<spng_ctx, void (*)(spng_ctx*)> ctx(spng_ctx_new(SPNG_CTX_ENCODER), spng_ctx_free);
  spng_set_option(ctx.get(), SPNG_ENCODE_TO_BUFFER, 1);
  spng_ihdr ihdr{.width = 8, .height = 2, .bit_depth = 1, .color_type = SPNG_COLOR_TYPE_GRAYSCALE};
  spng_set_ihdr(ctx.get(), &ihdr);
  std::uint8_t packed[2] = {0b10110000, 0b00001111};
  ASSERT_EQ(spng_encode_image(ctx.get(), packed, 2, SPNG_FMT_PNG, SPNG_ENCODE_FINALIZE), 0);
  std::size_t size = 0;
  int error = 0;
  auto* buffer = static_cast<std::uint8_t*>(spng_get_png_buffer(ctx.get(), &size, &error));
  const Bytes one_bit(buffer, buffer + size);
  std::free(buffer);
  EXPECT_TRUE(fl::decode_mask(one_bit, "bits.png")
                  .equal(torch::tensor({1, 0, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1}, torch::kInt32).view({2, 8})));
}

TEST(MaskDecode, JpegRgbAndBrokenMasksAreRefusedNamingTheFile) {
  const auto jpeg_message = flt::message_of([] { fl::decode_mask(jpeg(picture(8, 8), false), "m.jpg"); });
  EXPECT_NE(jpeg_message.find("m.jpg: a JPEG cannot be a mask"), std::string::npos) << jpeg_message;
  const auto rgb = flt::message_of([] { fl::decode_mask(png(picture(4, 4), SPNG_COLOR_TYPE_TRUECOLOR), "rgb.png"); });
  EXPECT_NE(rgb.find("rgb.png: an RGB PNG cannot be a mask"), std::string::npos) << rgb;
  auto truncated = png(picture(8, 8).select(2, 0).unsqueeze(2).contiguous(), SPNG_COLOR_TYPE_GRAYSCALE);
  truncated.resize(truncated.size() / 2);
  EXPECT_THROW(fl::decode_mask(truncated, "half.png"), fl::DataError);
  EXPECT_THROW(fl::decode_mask(Bytes{}, "empty.png"), fl::DataError);
  // Sizes from the header, without decoding
  const auto dir = std::filesystem::temp_directory_path() / ("fastlearn-masks-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  for (const auto& [name, bytes] : {std::pair{"a.png", png(picture(5, 7), SPNG_COLOR_TYPE_TRUECOLOR)},
                                    std::pair{"b.jpg", jpeg(picture(9, 3), false)}}) {
    std::ofstream(dir / name, std::ios::binary)
        .write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  }
  EXPECT_EQ(fl::read_image_size(dir / "a.png"), (fl::ImageSize{5, 7}));
  EXPECT_EQ(fl::read_image_size(dir / "b.jpg"), (fl::ImageSize{9, 3}));
  EXPECT_THROW(fl::read_image_size(dir / "missing.png"), fl::DataError);
  std::filesystem::remove_all(dir);
}
