#include <fastlearn/data/dataloaders.h>

#include <fastlearn/core/detail/text.h>
#include <fastlearn/data/dataset.h>

#include <fmt/format.h>
#include <torch/torch.h>

namespace fastlearn {

DataLoaders::DataLoaders(DataLoader train, DataLoader valid, std::int64_t c)
    : train_(std::move(train)), valid_(std::move(valid)), c_(c) {}

DataLoaders::DataLoaders(DataLoader train, DataLoader valid, std::vector<std::string> vocab, bool multi_label)
    : train_(std::move(train)),
      valid_(std::move(valid)),
      c_(static_cast<std::int64_t>(vocab.size())),
      vocab_(std::move(vocab)),
      multi_label_(multi_label) {
  // Every source of class names comes through here (folders, CSV labels, lists, a table's target): a name that is
  // not UTF-8 is refused now, not when the first checkpoint is written an epoch later.
  for (std::size_t i = 0; i < vocab_.size(); ++i)
    require_utf8(vocab_[i], fmt::format("class #{}", i), "rename it (its folder, or its label in the data)");
}

void DataLoaders::to(const c10::Device& device) {
  train_.set_device(device);
  valid_.set_device(device);
}

DataLoaders DataLoaders::none() {
  auto items = std::make_shared<TensorDataset>(std::vector<at::Tensor>{at::zeros({0})}, std::vector<at::Tensor>{});
  return DataLoaders(DataLoader(items, {.seed = 0}), DataLoader(items, {.seed = 0}), 0);
}

}  // namespace fastlearn
