#pragma once
// DataLoader: turns a Dataset into batches, epoch after epoch. Per epoch: the sampler gives the item
// order; each batch of `bs` indices is fetched with Dataset::load_batch (in background workers when
// num_workers > 0, up to `prefetch` batches ahead per worker), passed through the batch transforms and
// handed out in order, moved to the device if one is set. On a CUDA device the batch is copied from
// pinned memory and the transforms run on the GPU after the copy; elsewhere they run in the workers.
#include <fastlearn/data/batch.h>
#include <fastlearn/data/dataset.h>
#include <fastlearn/data/sampler.h>
#include <fastlearn/data/transforms.h>

#include <c10/core/Device.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

namespace fastlearn {

class BufferPool;

struct DataLoaderOptions {
  std::int64_t bs = 64;
  bool shuffle = false;
  bool drop_last = false;             ///< drop the last batch when it is smaller than bs
  int num_workers = 0;                ///< background threads; 0 loads in the caller's thread
  int prefetch = 2;                   ///< batches each worker prepares ahead
  std::optional<std::uint64_t> seed;  ///< order and augmentation seed; default: drawn from torch's generator
  std::vector<BatchTransform> batch_tfms;
  std::optional<c10::Device> device;  ///< where batches go; CUDA: pinned memory, non-blocking copies, tfms on the GPU
};

class DataLoader {
 public:
  DataLoader(std::shared_ptr<const Dataset> dataset, DataLoaderOptions options = {});

  /// Batches per epoch.
  std::int64_t size() const;
  /// Items per epoch (the sampler's size).
  std::int64_t n() const;
  const Dataset& dataset() const { return *dataset_; }
  std::shared_ptr<const Dataset> dataset_ptr() const { return dataset_; }
  const DataLoaderOptions& options() const { return options_; }
  std::uint64_t seed() const { return seed_; }
  /// Sets the order and augmentation seed; a RandomSampler in use is redrawn from it (other samplers stay).
  void set_seed(std::uint64_t seed);

  /// The epoch the next iteration runs (each begin() runs one epoch, then advances it).
  std::int64_t epoch() const { return epoch_; }
  void set_epoch(std::int64_t epoch) { epoch_ = epoch; }

  /// The sampler in use; replace it to change the order or the subset (as DistributedDL does).
  const Sampler& sampler() const { return *sampler_; }
  std::shared_ptr<const Sampler> sampler_ptr() const { return sampler_; }
  void set_sampler(std::shared_ptr<const Sampler> sampler);

  void set_device(std::optional<c10::Device> device) { options_.device = device; }

  class EpochRun;
  class Iterator {
   public:
    using difference_type = std::ptrdiff_t;
    using value_type = Batch;
    Iterator() = default;
    const Batch& operator*() const;
    const Batch* operator->() const { return &**this; }
    Iterator& operator++();
    bool operator==(const Iterator& other) const { return position() == other.position(); }

   private:
    friend class DataLoader;
    explicit Iterator(std::shared_ptr<EpochRun> run);
    std::int64_t position() const;
    std::shared_ptr<EpochRun> run_;
    std::int64_t end_ = 0;
  };

  /// Starts the next epoch. Iterating twice runs two epochs (two orders when shuffling).
  Iterator begin();
  Iterator end() const;

  /// The first batch of the next epoch, without advancing the epoch (like fastai's one_batch).
  Batch one_batch();

 private:
  std::shared_ptr<const Dataset> dataset_;
  DataLoaderOptions options_;
  std::uint64_t seed_ = 0;
  std::shared_ptr<const Sampler> sampler_;
  std::int64_t epoch_ = 0;
  std::shared_ptr<BufferPool> buffers_;  // batch memory reused across batches and epochs (see buffer_pool.h)
};

}  // namespace fastlearn
