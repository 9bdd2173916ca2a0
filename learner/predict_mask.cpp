#include <fastlearn/learner/predict_mask.h>

#include <fastlearn/core/detail/text.h>
#include <fastlearn/core/error.h>
#include <fastlearn/data/image_decode.h>
#include <fastlearn/data/inference_pipeline.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>

namespace fastlearn {

namespace {

constexpr std::int64_t kMaxPredictedSide = 4096;
constexpr std::int64_t kMaxProbabilities = std::int64_t{1} << 28;

}  // namespace

ImageSize prediction_size(ImageSize image, ImageSize items, ResizeMethod method) {
  const double sh = static_cast<double>(items.height) / static_cast<double>(image.height);
  const double sw = static_cast<double>(items.width) / static_cast<double>(image.width);
  const auto scaled = [](std::int64_t side, double scale) {
    return std::max<std::int64_t>(1, std::llround(static_cast<double>(side) * scale));
  };
  switch (method) {
    case ResizeMethod::squish:
      return {items.height, items.width};
    case ResizeMethod::pad:
      return {scaled(image.height, std::min(sh, sw)), scaled(image.width, std::min(sh, sw))};
    case ResizeMethod::crop:
      break;
  }
  return {scaled(image.height, std::max(sh, sw)), scaled(image.width, std::max(sh, sw))};
}

MaskPrediction predict_mask(Learner& learn, const std::filesystem::path& file, const PredictMaskOptions& options) {
  const auto* pipeline = learn.dls().image_pipeline();
  const auto origin = excerpt(file.string(), 256);
  if (pipeline == nullptr || !pipeline->masks) {
    throw ConfigError(fmt::format(
        "predict_mask('{}'): the learner's data is not segmentation images (SegmentationDataLoaders make them)",
        origin));
  }
  // Checked from the file's header before anything of these sizes is made.
  const auto original = read_image_size(file);
  const auto size = prediction_size(original, pipeline->size, pipeline->method);
  if (size.height > kMaxPredictedSide || size.width > kMaxPredictedSide) {
    throw DataError(fmt::format(
        "{}: an image of {}x{} pixels is predicted at the items' scale, {}x{}, above {} a side; crop it first", origin,
        original.height, original.width, size.height, size.width, kMaxPredictedSide));
  }
  const auto classes = learn.dls().c();
  if (options.probs && classes * original.height * original.width > kMaxProbabilities) {
    throw DataError(
        fmt::format("{}: the probabilities of {} classes at {}x{} pixels exceed 2^28 values; predict the mask alone "
                    "(PredictMaskOptions::probs = false)",
                    origin, classes, original.height, original.width));
  }
  const auto image = read_image(file, {.mode = pipeline->mode});
  const auto resized = resize_image(image, size, ResizeMethod::squish);
  const auto probs = learn.predict(Item{{resized}, {}}).probs.to(torch::kCPU, torch::kFloat);
  if (probs.dim() != 3 || probs.size(0) != classes) {
    throw ConfigError(fmt::format("predict_mask('{}'): the model gives [{}] per item, not a map per class ({})", origin,
                                  fmt::join(probs.sizes(), ", "), classes));
  }
  // Resized back bilinearly (align_corners false, edges clamped: upsample_bilinear2d's sampling) a band of rows at a
  // time, so that only the probabilities asked for are ever whole.
  const auto height = original.height, width = original.width;
  MaskPrediction out{.mask = torch::empty({height, width}, torch::kLong)};
  if (options.probs) out.probs = torch::empty({classes, height, width});
  const auto xs = (torch::arange(width, torch::kDouble) + 0.5) / static_cast<double>(width) * 2 - 1;
  const auto band = std::max<std::int64_t>(1, (std::int64_t{1} << 22) / std::max<std::int64_t>(1, classes * width));
  auto counts = torch::zeros({classes}, torch::kLong);
  for (std::int64_t row = 0; row < height; row += band) {
    const auto rows = std::min(band, height - row);
    const auto ys = (torch::arange(row, row + rows, torch::kDouble) + 0.5) / static_cast<double>(height) * 2 - 1;
    const auto grid = torch::stack({xs.expand({rows, width}), ys.unsqueeze(1).expand({rows, width})}, 2)
                          .to(torch::kFloat)
                          .unsqueeze(0);
    const auto tile = at::grid_sampler(probs.unsqueeze(0), grid, /*bilinear*/ 0, /*border*/ 1, false).squeeze(0);
    const auto mask = tile.argmax(0);
    out.mask.narrow(0, row, rows).copy_(mask);
    if (options.probs) out.probs.narrow(1, row, rows).copy_(tile);
    counts += at::bincount(mask.flatten(), {}, classes);
  }
  const auto shares = (counts.to(torch::kDouble) / static_cast<double>(height * width)).contiguous();
  out.shares.assign(shares.data_ptr<double>(), shares.data_ptr<double>() + shares.numel());
  return out;
}

}  // namespace fastlearn
