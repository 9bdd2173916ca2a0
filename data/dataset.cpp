#include <fastlearn/data/dataset.h>

#include <fastlearn/core/error.h>
#include <fmt/format.h>
#include <torch/torch.h>

namespace fastlearn {

Batch Dataset::get_batch(std::span<const std::int64_t> indices) const {
  std::vector<Item> items;
  items.reserve(indices.size());
  for (auto i : indices) items.push_back(get(i));
  return collate(items);
}

Batch Dataset::load_batch(std::span<const std::int64_t> indices, at::Generator& /*rng*/) const {
  return get_batch(indices);
}

Batch collate(const std::vector<Item>& items) {
  if (items.empty()) return {};
  const auto n_inputs = items.front().inputs.size();
  const auto n_targets = items.front().targets.size();
  auto stack_position = [&](bool input, std::size_t position) {
    std::vector<at::Tensor> column;
    column.reserve(items.size());
    for (std::size_t i = 0; i < items.size(); ++i) {
      const auto& part = input ? items[i].inputs : items[i].targets;
      if (part.size() != (input ? n_inputs : n_targets)) {
        throw DataError(fmt::format("collate: item {} has {} {} tensor(s), item 0 has {}", i, part.size(),
                                    input ? "input" : "target", input ? n_inputs : n_targets));
      }
      column.push_back(part[position]);
    }
    try {
      return torch::stack(column);
    } catch (const c10::Error& e) {
      throw DataError(fmt::format("collate: cannot stack {} {} of the batch: items differ in shape ({})",
                                  input ? "input" : "target", position, e.what_without_backtrace()));
    }
  };
  Batch batch;
  for (std::size_t p = 0; p < n_inputs; ++p) batch.inputs.push_back(stack_position(true, p));
  for (std::size_t p = 0; p < n_targets; ++p) batch.targets.push_back(stack_position(false, p));
  return batch;
}

TensorDataset::TensorDataset(std::vector<at::Tensor> inputs, std::vector<at::Tensor> targets)
    : inputs_(std::move(inputs)), targets_(std::move(targets)) {
  if (inputs_.empty()) throw DataError("TensorDataset needs at least one input tensor");
  size_ = inputs_.front().dim() > 0 ? inputs_.front().size(0) : -1;
  auto check = [&](const std::vector<at::Tensor>& tensors, const char* what) {
    for (std::size_t i = 0; i < tensors.size(); ++i) {
      if (tensors[i].dim() == 0 || tensors[i].size(0) != size_) {
        throw DataError(
            fmt::format("TensorDataset: {} {} has {} items, input 0 has {}; every tensor needs the same "
                        "first dimension",
                        what, i, tensors[i].dim() ? tensors[i].size(0) : 0, size_));
      }
    }
  };
  check(inputs_, "input");
  check(targets_, "target");
}

std::int64_t TensorDataset::size() const { return size_; }

Item TensorDataset::get(std::int64_t index) const {
  if (index < 0 || index >= size_)
    throw DataError(fmt::format("TensorDataset: index {} is out of range for {} items", index, size_));
  Item item;
  for (const auto& t : inputs_) item.inputs.push_back(t[index]);
  for (const auto& t : targets_) item.targets.push_back(t[index]);
  return item;
}

Batch TensorDataset::get_batch(std::span<const std::int64_t> indices) const {
  auto index = torch::from_blob(const_cast<std::int64_t*>(indices.data()), {static_cast<std::int64_t>(indices.size())},
                                torch::kLong);
  if (!indices.empty()) {
    const auto [lo, hi] = std::minmax_element(indices.begin(), indices.end());
    if (*lo < 0 || *hi >= size_)
      throw DataError(fmt::format("TensorDataset: index {} is out of range for {} items", *lo < 0 ? *lo : *hi, size_));
  }
  Batch batch;
  // A dataset held on a GPU is indexed there (the index is tiny; the items never cross to the host). The index
  // crosses through pinned memory without blocking: a blocking copy would wait for the GPU to finish the step
  // before, and leave it idle while the next one is launched.
  at::Tensor device_index;
  auto select = [&](const at::Tensor& t) {
    if (t.is_cpu()) return t.index_select(0, index);
    if (!device_index.defined() || device_index.device() != t.device()) {
      device_index = t.is_cuda() ? index.pin_memory().to(t.device(), /*non_blocking=*/true) : index.to(t.device());
    }
    return t.index_select(0, device_index);
  };
  for (const auto& t : inputs_) batch.inputs.push_back(select(t));
  for (const auto& t : targets_) batch.targets.push_back(select(t));
  return batch;
}

}  // namespace fastlearn
