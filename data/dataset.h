#pragma once
// A Dataset maps an index in [0, size()) to an Item; get_batch fetches many at once (by default by
// stacking items; datasets held in tensors override it with one gather). The DataLoader calls load_batch,
// which hands datasets with random item transforms (image crops) the batch's seeded generator.
#include <ATen/core/Generator.h>
#include <fastlearn/data/batch.h>

#include <cstdint>
#include <span>
#include <vector>

namespace fastlearn {

class Dataset {
 public:
  virtual ~Dataset() = default;

  /// Number of items.
  virtual std::int64_t size() const = 0;

  /// The item at `index` (0 <= index < size()).
  virtual Item get(std::int64_t index) const = 0;

  /// The items at `indices`, collated into a batch. Default: get() each and stack position by position.
  virtual Batch get_batch(std::span<const std::int64_t> indices) const;

  /// What the DataLoader calls for each batch: `rng` is seeded by (seed, epoch, batch), so random item
  /// transforms give the same items whichever worker loads the batch. Default: get_batch(indices).
  virtual Batch load_batch(std::span<const std::int64_t> indices, at::Generator& rng) const;
  /// Whether each process of a data parallel job has items of its own here (a running program's samples, the step
  /// API's), rather than a share of items every process sees: DistributedDL then leaves its loader whole.
  virtual bool per_process() const { return false; }
};

/// Stacks items position by position into a batch; every item must have the same structure and shapes.
Batch collate(const std::vector<Item>& items);

/// A dataset held in tensors whose first dimension indexes the items (like torch's TensorDataset).
class TensorDataset : public Dataset {
 public:
  /// All tensors must have the same first dimension; throws DataError naming the one that differs.
  TensorDataset(std::vector<at::Tensor> inputs, std::vector<at::Tensor> targets);

  std::int64_t size() const override;
  Item get(std::int64_t index) const override;
  Batch get_batch(std::span<const std::int64_t> indices) const override;

  const std::vector<at::Tensor>& inputs() const { return inputs_; }
  const std::vector<at::Tensor>& targets() const { return targets_; }

 private:
  std::vector<at::Tensor> inputs_;
  std::vector<at::Tensor> targets_;
  std::int64_t size_ = 0;
};

}  // namespace fastlearn
