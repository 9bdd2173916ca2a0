#pragma once
// DataLoaders: the train and valid loaders of a task, their device, and the number of classes.
#include <fastlearn/data/dataloader.h>

#include <filesystem>

namespace fastlearn {

class DataLoaders {
 public:
  DataLoaders(DataLoader train, DataLoader valid, std::int64_t c);

  DataLoader& train() { return train_; }
  DataLoader& valid() { return valid_; }
  const DataLoader& train() const { return train_; }
  const DataLoader& valid() const { return valid_; }
  /// Number of classes (output size of a classifier for this data).
  std::int64_t c() const { return c_; }

  /// Puts both loaders' batches on `device`.
  void to(const c10::Device& device);
  std::optional<c10::Device> device() const { return train_.options().device; }

 private:
  DataLoader train_;
  DataLoader valid_;
  std::int64_t c_;
};

struct ImageDataLoadersOptions {
  std::int64_t bs = 64;
  std::int64_t valid_bs = 0;  ///< 0: twice bs, as there is no backward pass to hold memory for
  int num_workers = 0;
  std::optional<std::uint64_t> seed;
  bool normalize = true;          ///< scale to [0, 1], then per-channel mean/std of the training images
  bool augment = false;           ///< training only: random crop (padding crop_padding) and left-right flip (flip_p)
  std::int64_t crop_padding = 2;  ///< with augment: 0 leaves out the random crop
  double flip_p = 0.5;            ///< with augment: 0 leaves out the flip
  std::optional<c10::Device> device;
};

struct ImageDataLoaders {
  /// MNIST-format folder: train-images/-labels for training, t10k-images/-labels for validation, each
  /// `*-idx3-ubyte` / `*-idx1-ubyte`, gzipped (.gz) or raw. Images stay uint8 in memory; batches are
  /// converted and normalized by the loader.
  static DataLoaders from_idx(const std::filesystem::path& dir, const ImageDataLoadersOptions& options = {});
};

}  // namespace fastlearn
