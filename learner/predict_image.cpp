#include <fastlearn/learner/predict_image.h>

#include <fastlearn/core/detail/text.h>
#include <fastlearn/core/error.h>
#include <fastlearn/data/image_dataset.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/torch.h>

#include <algorithm>

namespace fastlearn {

ImagePrediction predict_image(Learner& learn, const std::filesystem::path& file, double threshold) {
  const auto* images = dynamic_cast<const ImageDataset*>(&learn.dls().valid().dataset());
  const auto& vocab = learn.dls().vocab();
  if (!images || vocab.empty()) {
    throw ConfigError(
        fmt::format("predict_image('{}'): the learner's data is not image files with named classes "
                    "(make it with ImageDataLoaders::from_folder, from_csv, ...)",
                    excerpt(file.string(), 256)));
  }
  const auto& options = images->options();
  auto image = read_image(file, {.mode = options.mode, .min_side = options.decode_min_side});
  if (options.item_tfm) image = options.item_tfm(image, nullptr);
  const auto predicted = learn.predict(Item{{image}, {}});
  const auto probs = predicted.probs.to(torch::kCPU, torch::kDouble).contiguous();
  if (probs.numel() != static_cast<std::int64_t>(vocab.size())) {
    throw ConfigError(fmt::format("predict_image: the model gives {} values but the data has {} classes", probs.numel(),
                                  vocab.size()));
  }
  ImagePrediction out{.probs = probs.to(torch::kFloat)};
  const auto* p = probs.data_ptr<double>();
  if (learn.dls().multi_label()) {
    for (std::size_t c = 0; c < vocab.size(); ++c) {
      if (p[c] >= threshold) out.classes.emplace_back(vocab[c], p[c]);
    }
    std::sort(out.classes.begin(), out.classes.end(), [](const auto& a, const auto& b) { return a.second > b.second; });
  } else {
    const auto best = std::max_element(p, p + vocab.size()) - p;
    out.classes.emplace_back(vocab[static_cast<std::size_t>(best)], p[best]);
  }
  return out;
}

std::string describe(const ImagePrediction& prediction) {
  if (prediction.classes.empty()) return "-";
  std::vector<std::string> parts;
  for (const auto& [name, prob] : prediction.classes) parts.push_back(fmt::format("{} {:.3f}", name, prob));
  return fmt::format("{}", fmt::join(parts, ", "));
}

}  // namespace fastlearn
