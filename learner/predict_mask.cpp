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

MaskPrediction predict_mask(Learner& learn, const std::filesystem::path& file) {
  const auto* pipeline = learn.dls().image_pipeline();
  if (pipeline == nullptr || !pipeline->masks) {
    throw ConfigError(fmt::format(
        "predict_mask('{}'): the learner's data is not segmentation images (SegmentationDataLoaders make them)",
        excerpt(file.string(), 256)));
  }
  const auto image = read_image(file, {.mode = pipeline->mode});
  const ImageSize original{image.size(1), image.size(2)};
  const auto size = prediction_size(original, pipeline->size, pipeline->method);
  const auto resized = resize_image(image, size, ResizeMethod::squish);
  const auto probs = learn.predict(Item{{resized}, {}}).probs.to(torch::kCPU, torch::kFloat);
  if (probs.dim() != 3 || probs.size(0) != learn.dls().c()) {
    throw ConfigError(fmt::format("predict_mask('{}'): the model gives [{}] per item, not a map per class ({})",
                                  excerpt(file.string(), 256), fmt::join(probs.sizes(), ", "), learn.dls().c()));
  }
  MaskPrediction out;
  out.probs = at::upsample_bilinear2d(probs.unsqueeze(0), {original.height, original.width}, false).squeeze(0);
  out.mask = out.probs.argmax(0);
  const auto counts = at::bincount(out.mask.flatten(), {}, probs.size(0)).to(torch::kDouble);
  const auto shares = (counts / static_cast<double>(out.mask.numel())).contiguous();
  out.shares.assign(shares.data_ptr<double>(), shares.data_ptr<double>() + shares.numel());
  return out;
}

}  // namespace fastlearn
