#include <fastlearn/learner/named_predictions.h>

#include <fastlearn/core/error.h>
#include <fastlearn/data/tabular_dataloaders.h>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/torch.h>

#include <algorithm>

namespace fastlearn {

bool predicts_values(Learner& learn) {
  if (const auto* table = tabular_dataset(learn.dls())) return table->regression();
  return learn.dls().vocab().empty() && learn.loss_func().name != "cross_entropy" &&
         learn.loss_func().name != "bce_with_logits";
}

std::vector<std::string> output_names(Learner& learn) {
  if (const auto* table = tabular_dataset(learn.dls()); table && table->regression()) return table->y_names();
  if (!learn.dls().vocab().empty()) return learn.dls().vocab();
  std::vector<std::string> names;
  for (std::int64_t i = 0; i < learn.dls().c(); ++i) names.push_back(std::to_string(i));
  return names;
}

std::vector<NamedPrediction> name_predictions(const at::Tensor& preds, Learner& learn, double threshold) {
  const auto names = output_names(learn);
  const auto c = static_cast<std::int64_t>(names.size());
  // One value per item (fastai's EmbeddingDotBias, a script's regression) is one output.
  const auto rows =
      (preds.dim() == 1 && c == 1 ? preds.unsqueeze(1) : preds).to(torch::kCPU, torch::kDouble).contiguous();
  if (rows.dim() != 2 || rows.size(1) != c)
    throw ConfigError(fmt::format("name_predictions: the predictions have shape [{}], the data has {} output(s)",
                                  fmt::join(rows.sizes(), ", "), c));
  const bool values = predicts_values(learn);
  const bool multi_label = learn.dls().multi_label();
  std::vector<NamedPrediction> out(static_cast<std::size_t>(rows.size(0)));
  const auto* p = rows.data_ptr<double>();
  for (std::size_t i = 0; i < out.size(); ++i, p += c) {
    auto& named = out[i];
    if (values || multi_label) {
      for (std::int64_t j = 0; j < c; ++j)
        if (values || p[j] >= threshold) named.emplace_back(names[static_cast<std::size_t>(j)], p[j]);
      if (multi_label)
        std::stable_sort(named.begin(), named.end(), [](const auto& a, const auto& b) { return a.second > b.second; });
    } else {
      const auto best = std::max_element(p, p + c) - p;
      named.emplace_back(names[static_cast<std::size_t>(best)], p[best]);
    }
  }
  return out;
}

std::string describe(const NamedPrediction& prediction, bool significant) {
  if (prediction.empty()) return "-";
  std::vector<std::string> parts;
  for (const auto& [name, value] : prediction)
    parts.push_back(significant ? fmt::format("{} {:.6g}", name, value) : fmt::format("{} {:.3f}", name, value));
  return fmt::format("{}", fmt::join(parts, ", "));
}

}  // namespace fastlearn
