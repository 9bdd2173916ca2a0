#pragma once
// DataLoaders: the train and valid loaders of a task, their device, the number of classes and, for
// named classes, their vocabulary (saved with the model, so that predictions map back to names).
#include <fastlearn/data/dataloader.h>

#include <memory>
#include <string>
#include <vector>

namespace fastlearn {

struct ImagePipeline;

class DataLoaders {
 public:
  DataLoaders(DataLoader train, DataLoader valid, std::int64_t c);
  /// Classes named by `vocab` (c = its size; class i is vocab[i]). `multi_label`: each item has any number of
  /// the classes (targets are multi-hot float rows of c values, for a BCE-with-logits loss).
  DataLoaders(DataLoader train, DataLoader valid, std::vector<std::string> vocab, bool multi_label = false);
  /// Loaders of no items and no classes: a Learner's without data (the step API, inference).
  static DataLoaders none();

  DataLoader& train() { return train_; }
  DataLoader& valid() { return valid_; }
  const DataLoader& train() const { return train_; }
  const DataLoader& valid() const { return valid_; }
  /// Number of classes (output size of a classifier for this data).
  std::int64_t c() const { return c_; }
  /// The class names, sorted as the class indices run; empty when the classes have no names.
  const std::vector<std::string>& vocab() const { return vocab_; }
  bool multi_label() const { return multi_label_; }

  /// Puts both loaders' batches on `device`.
  void to(const c10::Device& device);
  std::optional<c10::Device> device() const { return train_.options().device; }

  /// How a new image file becomes an input as the validation items did (data/inference_pipeline.h); recorded by the
  /// image builders, nullptr for other data.
  const ImagePipeline* image_pipeline() const { return image_pipeline_.get(); }
  void set_image_pipeline(std::shared_ptr<const ImagePipeline> pipeline) { image_pipeline_ = std::move(pipeline); }

 private:
  DataLoader train_;
  DataLoader valid_;
  std::int64_t c_;
  std::vector<std::string> vocab_;
  bool multi_label_ = false;
  std::shared_ptr<const ImagePipeline> image_pipeline_;
};

}  // namespace fastlearn
