#pragma once
// The shared body of vs_pytorch_loop and vs_fastai: samples/s of one training epoch of fastlearn's
// Learner.fit(1) against a Python side (bench/python/epoch_server.py) on the same Fashion-MNIST items
// (the first 100 batches of 128 training images, 2048 test images for validation), the same model, batch
// size, optimizer settings (Adam: betas 0.9/0.99, eps 1e-5, decoupled wd 0.01, lr 1e-3) and thread count.
// Each side warms up with one epoch; then the repeats interleave. Both sides validate after each epoch
// (loss and accuracy), which is part of the time.
#include "bench_support.h"
#include "source_dir.h"

#include <fastlearn/callbacks/channels_last.h>
#include <fastlearn/data/image_dataloaders.h>
#include <fastlearn/learner/learner.h>
#include <fastlearn/models/models.h>

#include <torch/torch.h>

#include <optional>
#include <sstream>

namespace bench {

constexpr std::int64_t kEpochBatch = 128, kEpochTrainItems = 100 * kEpochBatch, kEpochValidItems = 2048;

inline fastlearn::DataLoaders first_items(const fastlearn::DataLoaders& full, std::int64_t train, std::int64_t valid) {
  auto slice = [](const fastlearn::DataLoader& dl, std::int64_t n) {
    const auto& ds = static_cast<const fastlearn::TensorDataset&>(dl.dataset());
    auto part = std::make_shared<fastlearn::TensorDataset>(std::vector<at::Tensor>{ds.inputs()[0].slice(0, 0, n)},
                                                           std::vector<at::Tensor>{ds.targets()[0].slice(0, 0, n)});
    return fastlearn::DataLoader(part, dl.options());
  };
  return fastlearn::DataLoaders(slice(full.train(), train), slice(full.valid(), valid), full.c());
}

/// The models the benchmarks name, the same layers as bench/python/fashion.py's model(name).
inline torch::nn::Sequential named_model(const std::string& name) {
  if (name == "simple_cnn") return fastlearn::models::simple_cnn(10);
  if (name == "mlp") return fastlearn::models::mlp(784, {512, 256}, 10);
  throw std::runtime_error("bench: unknown model " + name);
}

struct EpochComparison {
  Stats ours, anchor;  // train samples per second
  double ours_accuracy = 0, anchor_accuracy = 0;
  int threads = 0, repeats = 0;
};

/// side: "torch" or "fastai" (see epoch_server.py). channels_last: both sides train in channels-last memory
/// format (ours: the ChannelsLast callback; the Python side: the same through torch or fastai), unless
/// anchor_channels_last says otherwise for the Python side (each library's default layout, side by side).
inline EpochComparison compare_epochs(const std::string& side, const std::string& model_name, const std::string& data,
                                      int n_repeats, bool channels_last = false,
                                      std::optional<bool> anchor_channels_last = std::nullopt) {
  namespace fl = fastlearn;
  const int threads = at::get_num_threads();
  std::vector<std::string> command{
      FASTLEARN_PYTHON, std::string(FASTLEARN_SOURCE_DIR) + "/bench/python/epoch_server.py",
      "--side",         side,
      "--model",        model_name,
      "--data",         data,
      "--threads",      std::to_string(threads),
      "--bs",           std::to_string(kEpochBatch),
      "--train-items",  std::to_string(kEpochTrainItems),
      "--valid-items",  std::to_string(kEpochValidItems)};
  if (anchor_channels_last.value_or(channels_last)) command.push_back("--channels-last");
  Coprocess python(command);
  if (python.read_line() != "ready") throw std::runtime_error("bench: epoch_server.py did not start");

  auto dls = first_items(fl::ImageDataLoaders::from_idx(data, {.bs = kEpochBatch, .seed = 0}), kEpochTrainItems,
                         kEpochValidItems);
  torch::manual_seed(0);
  // Against the hand-written loop, weight decay on every parameter as torch.optim.AdamW applies it; against fastai,
  // the Learner's default, which is fastai's (no decay on normalization layers and biases).
  fl::Learner learn(
      dls, named_model(model_name), fl::cross_entropy(),
      {.opt_func = fl::Adam(), .metrics = {fl::accuracy()}, .wd_bn_bias = side == "torch", .progress = false});
  if (channels_last) learn.add_cb(std::make_shared<fl::ChannelsLast>());
  const double train_items = static_cast<double>(dls.train().size() * kEpochBatch);

  EpochComparison result{.threads = threads, .repeats = n_repeats};
  auto python_epoch = [&] {
    std::istringstream reply(python.request("epoch"));
    double seconds = 0;
    if (!(reply >> seconds >> result.anchor_accuracy) || seconds <= 0) {
      throw std::runtime_error("bench: epoch_server.py answered '" + reply.str() + "'");
    }
    return seconds;
  };
  learn.fit(1, 1e-3);  // warm-up both sides
  python_epoch();
  std::vector<double> ours, anchor;
  for (int r = 0; r < n_repeats; ++r) {
    const auto start = Clock::now();
    learn.fit(1, 1e-3);
    ours.push_back(train_items / seconds_since(start));
    anchor.push_back(train_items / python_epoch());
  }
  result.ours = summarize(ours);
  result.anchor = summarize(anchor);
  result.ours_accuracy = learn.validate().metric("accuracy");
  return result;
}

/// One JSON member `"name": {...}` in the results format of ARCHITECTURE.md "Contracts".
inline std::string epoch_json(const std::string& name, const EpochComparison& c, const std::string& what) {
  return fmt::format(
      R"("{}": {{"ours": {:.1f}, "anchor": {:.1f}, "ratio": {:.3f}, "unit": "train samples/s", "higher_is_better": true, )"
      R"("ours_range": [{:.1f}, {:.1f}], "anchor_range": [{:.1f}, {:.1f}], "threads": {}, "repeats": {}, "batch": {}, )"
      R"("train_items": {}, "valid_items": {}, "ours_valid_accuracy": {:.4f}, "anchor_valid_accuracy": {:.4f}, "what": "{}"}})",
      name, c.ours.median, c.anchor.median, c.ours.median / c.anchor.median, c.ours.min, c.ours.max, c.anchor.min,
      c.anchor.max, c.threads, c.repeats, kEpochBatch, kEpochTrainItems, kEpochValidItems, c.ours_accuracy,
      c.anchor_accuracy, what);
}

}  // namespace bench
