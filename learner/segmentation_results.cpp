#include <fastlearn/learner/segmentation_results.h>

#include <fastlearn/core/atomic_file.h>
#include <fastlearn/core/detail/text.h>
#include <fastlearn/core/error.h>
#include <fastlearn/data/image_encode.h>
#include <fastlearn/data/inference_pipeline.h>
#include <fastlearn/learner/export.h>
#include <fmt/format.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>

namespace fastlearn {

namespace {

void require_masks(Learner& learn, const char* what) {
  const auto* pipeline = learn.dls().image_pipeline();
  if (pipeline == nullptr || !pipeline->masks)
    throw ConfigError(fmt::format("{}: the learner's data is not segmentation images (SegmentationDataLoaders)", what));
}

// A colour per class, (classes, 3) uint8: class 0 black, then hues spaced by the golden angle (neighbours differ).
at::Tensor palette(std::int64_t classes) {
  auto colours = torch::zeros({std::max<std::int64_t>(classes, 1), 3}, torch::kUInt8);
  for (std::int64_t c = 1; c < classes; ++c) {
    const double hue = std::fmod(static_cast<double>(c - 1) * 0.381966, 1.0) * 6.0;
    const double x = 1.0 - std::abs(std::fmod(hue, 2.0) - 1.0);
    const double rgb[6][3] = {{1, x, 0}, {x, 1, 0}, {0, 1, x}, {0, x, 1}, {x, 0, 1}, {1, 0, x}};
    const auto* row = rgb[static_cast<int>(hue) % 6];
    for (int k = 0; k < 3; ++k) colours[c][k] = static_cast<std::uint8_t>(55 + 200 * row[k]);
  }
  return colours;
}

// A mask (H, W) as an RGB image (3, H, W) in `colours`.
at::Tensor coloured(const at::Tensor& mask, const at::Tensor& colours) {
  return colours.index_select(0, mask.flatten().to(torch::kLong).clamp(0, colours.size(0) - 1))
      .view({mask.size(0), mask.size(1), 3})
      .permute({2, 0, 1});
}

}  // namespace

void show_results(Learner& learn, const std::filesystem::path& file, const ShowResultsOptions& options) {
  require_masks(learn, "show_results");
  const auto& items = learn.dls().valid().dataset();
  auto indices = options.items;
  if (indices.empty())
    for (std::int64_t i = 0; i < std::min(options.n, items.size()); ++i) indices.push_back(i);
  if (indices.empty()) throw DataError("show_results: no validation items to show");
  for (const auto i : indices)
    if (i < 0 || i >= items.size())
      throw DataError(fmt::format("show_results: item {} is not in the validation set of {}", i, items.size()));
  std::vector<Item> chosen;
  for (const auto i : indices) chosen.push_back(items.get(i));
  const auto batch = collate(chosen);
  const auto images = batch.inputs.at(0);
  const auto truth = batch.targets.at(0);
  if (images.scalar_type() != torch::kUInt8 || images.dim() != 4 || (images.size(1) != 1 && images.size(1) != 3))
    throw DataError("show_results: the validation items are not uint8 images of 1 or 3 channels");
  // The items as the model sees them: the validation loader's batch transforms, then the model.
  Batch model_batch = batch;
  at::Generator generator = at::detail::createCPUGenerator(0);
  for (const auto& tfm : learn.dls().valid().options().batch_tfms) tfm(model_batch, generator);
  // In chunks of the validation batch size: as much memory as validation takes.
  const auto chunk = std::max<std::int64_t>(1, learn.dls().valid().options().bs);
  std::vector<at::Tensor> parts;
  const auto inputs = model_batch.inputs.at(0);
  for (std::int64_t start = 0; start < inputs.size(0); start += chunk)
    parts.push_back(
        learn.predict_batch({inputs.narrow(0, start, std::min(chunk, inputs.size(0) - start))}).argmax(1).cpu());
  const auto predicted = torch::cat(parts);
  const auto colours = palette(learn.dls().c());
  const auto h = images.size(2), w = images.size(3);
  constexpr std::int64_t gap = 2;
  const auto rows = static_cast<std::int64_t>(indices.size());
  auto sheet = torch::full({3, rows * h + (rows - 1) * gap, 3 * w + 2 * gap}, 255, torch::kUInt8);
  for (std::int64_t r = 0; r < rows; ++r) {
    const auto top = r * (h + gap);
    const auto row = sheet.narrow(1, top, h);
    row.narrow(2, 0, w).copy_(images[r].expand({3, h, w}));
    row.narrow(2, w + gap, w).copy_(coloured(truth[r], colours));
    row.narrow(2, 2 * (w + gap), w).copy_(coloured(predicted[r], colours));
  }
  if (file.has_parent_path()) std::filesystem::create_directories(file.parent_path());
  write_file_atomically(file, encode_png(sheet.contiguous()));
}

std::vector<ItemLoss> segmentation_top_losses(Learner& learn, std::int64_t k) {
  require_masks(learn, "segmentation_top_losses");
  if (activation_of(learn.loss_func().name) != "softmax") {
    throw ConfigError(fmt::format(
        "segmentation_top_losses: the loss \"{}\" is not one of those that activate with a softmax over the classes "
        "(pixel_cross_entropy, dice_loss, cross_entropy_dice), whose losses it recovers from the probabilities",
        excerpt(learn.loss_func().name)));
  }
  std::vector<ItemLoss> losses;
  std::int64_t index = 0;
  // The activations are softmax probabilities; their logarithms are logits with the same softmax, so the loss over
  // them is the loss over the model's outputs.
  for (auto& batch : learn.dls().valid()) {
    const auto probs = learn.predict_batch(batch.inputs);
    const auto targets = batch.targets.at(0).to(probs.device());
    const auto logits = probs.clamp_min(1e-30).log();
    for (std::int64_t i = 0; i < probs.size(0); ++i) {
      const auto loss = learn.loss_func()(logits.narrow(0, i, 1), targets.narrow(0, i, 1)).mean().item<double>();
      losses.push_back({index++, loss});
    }
  }
  std::stable_sort(losses.begin(), losses.end(), [](const auto& a, const auto& b) { return a.loss > b.loss; });
  if (k >= 0 && static_cast<std::size_t>(k) < losses.size()) losses.resize(static_cast<std::size_t>(k));
  return losses;
}

}  // namespace fastlearn
