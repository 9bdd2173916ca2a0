#include <fastlearn/data/dataloaders.h>

namespace fastlearn {

DataLoaders::DataLoaders(DataLoader train, DataLoader valid, std::int64_t c)
    : train_(std::move(train)), valid_(std::move(valid)), c_(c) {}

DataLoaders::DataLoaders(DataLoader train, DataLoader valid, std::vector<std::string> vocab, bool multi_label)
    : train_(std::move(train)),
      valid_(std::move(valid)),
      c_(static_cast<std::int64_t>(vocab.size())),
      vocab_(std::move(vocab)),
      multi_label_(multi_label) {}

void DataLoaders::to(const c10::Device& device) {
  train_.set_device(device);
  valid_.set_device(device);
}

}  // namespace fastlearn
