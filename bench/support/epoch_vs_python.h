#pragma once
// The shared body of vs_pytorch_loop and vs_fastai: samples/s of one training epoch of fastlearn's
// Learner.fit(1) against a Python side (bench/python/epoch_server.py) on the same Fashion-MNIST items
// (the first 100 batches of 128 training images, 2048 test images for validation), the same model, batch
// size, optimizer settings (Adam: betas 0.9/0.99, eps 1e-5, decoupled wd 0.01, lr 1e-3) and thread count.
// Each side warms up with one epoch; then the repeats interleave. Both sides validate after each epoch
// (loss and accuracy), which is part of the time. A third timing, "bare", interleaved with the two: the same
// epoch's ATen work driven by a bare loop (the Learner's model and optimizer, batches made beforehand, no
// callbacks or metrics). bare / anchor is the ratio the Learner would reach if the library cost nothing: the
// ceiling with ATen's kernels.
#include "bench_support.h"
#include "result_row.h"
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
  Stats ours, anchor, bare;  // train samples per second
  double ours_accuracy = 0, anchor_accuracy = 0;
  int threads = 0, repeats = 0;
};

/// One epoch of `model` and `opt` over batches made beforehand: forward, loss, backward, step, zero_grad and
/// the running loss, then validation loss and accuracy; nothing else. Returns the seconds it took.
inline double bare_epoch(torch::nn::Sequential& model, fastlearn::Optimizer& opt,
                         const std::vector<fastlearn::Batch>& train, const std::vector<fastlearn::Batch>& valid) {
  namespace F = torch::nn::functional;
  const auto start = Clock::now();
  model->train();
  auto loss_sum = torch::zeros({});
  for (const auto& b : train) {
    auto loss = F::cross_entropy(model->forward(b.inputs[0]), b.targets[0]);
    loss.backward();
    opt.step();
    opt.zero_grad();
    loss_sum += loss.detach();
  }
  torch::NoGradGuard no_grad;
  model->eval();
  auto valid_loss = torch::zeros({});
  auto correct = torch::zeros({}, torch::kLong);
  for (const auto& b : valid) {
    auto out = model->forward(b.inputs[0]);
    valid_loss += F::cross_entropy(out, b.targets[0]);
    correct += out.argmax(1).eq(b.targets[0]).sum();
  }
  // Read once, at the end: the losses and accuracy exist, as in the other two epochs.
  if (!(loss_sum.item<double>() >= 0) || !(valid_loss.item<double>() >= 0) || correct.item<std::int64_t>() < 0)
    throw std::runtime_error("bench: the bare epoch's loss is not a number");
  return seconds_since(start);
}

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
  auto model = named_model(model_name);
  fl::Learner learn(
      dls, model, fl::cross_entropy(),
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
  // The bare loop's batches: the loaders' own, in the layout the ChannelsLast callback gives the model.
  std::vector<fl::Batch> train_batches, valid_batches;
  for (auto [dl, out] : {std::pair{&dls.train(), &train_batches}, std::pair{&dls.valid(), &valid_batches}}) {
    for (auto b : *dl) {
      if (channels_last) b.inputs[0] = b.inputs[0].contiguous(at::MemoryFormat::ChannelsLast);
      out->push_back(std::move(b));
    }
  }
  bare_epoch(model, learn.opt(), train_batches, valid_batches);  // warm-up
  std::vector<double> ours, anchor, bare;
  for (int r = 0; r < n_repeats; ++r) {
    const auto start = Clock::now();
    learn.fit(1, 1e-3);
    ours.push_back(train_items / seconds_since(start));
    anchor.push_back(train_items / python_epoch());
    bare.push_back(train_items / bare_epoch(model, learn.opt(), train_batches, valid_batches));
  }
  result.ours = summarize(ours);
  result.anchor = summarize(anchor);
  result.bare = summarize(bare);
  result.ours_accuracy = learn.validate().metric("accuracy");
  return result;
}

/// The row `"name": {...}` in the results format of ARCHITECTURE.md "Contracts".
inline Row epoch_json(const std::string& name, const EpochComparison& c, const std::string& what) {
  return Row(name, c.ours, c.anchor, "train samples/s", /*higher_is_better=*/true, 1)
      .set("threads", c.threads)
      .set("repeats", c.repeats)
      .set("batch", kEpochBatch)
      .set("train_items", kEpochTrainItems)
      .set("valid_items", kEpochValidItems)
      .set("ours_valid_accuracy", c.ours_accuracy, 4)
      .set("anchor_valid_accuracy", c.anchor_accuracy, 4)
      .stats("bare", c.bare, 1)
      .set("ceiling", c.bare.median / c.anchor.median, 3)
      .set("what", what);
}

}  // namespace bench
