#include <fastlearn/learner/predict_tabular.h>

#include <fastlearn/core/error.h>
#include <fastlearn/data/tabular_dataloaders.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/torch.h>

#include <algorithm>

namespace fastlearn {

TabularPrediction predict_row(Learner& learn, const std::map<std::string, std::string>& row,
                              const std::string& origin) {
  const auto* table = tabular_dataset(learn.dls());
  if (!table) {
    throw ConfigError("predict_row: the learner's data is not a table (make it with TabularDataLoaders::from_csv)");
  }
  // A row of the training table may hold its targets: the model does not read them, and they are no mistake.
  auto inputs = row;
  for (const auto& name : table->y_names()) inputs.erase(name);
  const auto x = table->procs().encode_row(inputs, origin, table->unknown_categories());
  const auto predicted = learn.predict(
      Item{table->layout().with_cont ? std::vector<at::Tensor>{x.cats[0], x.conts[0]} : std::vector{x.cats[0]}, {}});
  const auto outputs = predicted.probs.to(torch::kCPU, torch::kDouble).contiguous().flatten();
  const auto* v = outputs.data_ptr<double>();
  TabularPrediction out{.outputs = outputs.to(torch::kFloat)};
  if (table->regression()) {
    const auto& names = table->y_names();
    if (outputs.numel() != static_cast<std::int64_t>(names.size())) {
      throw ConfigError(
          fmt::format("predict_row: the model gives {} values for {} targets", outputs.numel(), names.size()));
    }
    for (std::size_t i = 0; i < names.size(); ++i) out.values.emplace_back(names[i], v[i]);
    return out;
  }
  const auto& vocab = learn.dls().vocab();
  if (outputs.numel() != static_cast<std::int64_t>(vocab.size())) {
    throw ConfigError(
        fmt::format("predict_row: the model gives {} values for {} classes", outputs.numel(), vocab.size()));
  }
  const auto best = std::max_element(v, v + vocab.size()) - v;
  out.values.emplace_back(vocab[static_cast<std::size_t>(best)], v[best]);
  return out;
}

std::string describe(const TabularPrediction& prediction) {
  std::vector<std::string> parts;
  for (const auto& [name, value] : prediction.values) parts.push_back(fmt::format("{} {:.6g}", name, value));
  return fmt::format("{}", fmt::join(parts, ", "));
}

}  // namespace fastlearn
