// learner_overhead: one epoch (100 training batches of 128 + validation) of simple_cnn on Fashion-MNIST
// through Learner.fit with its default callbacks (TrainEval, Recorder, Progress) against a hand-written
// LibTorch loop doing the same steps with the same loaders, model, loss and optimizer: forward, loss,
// backward, step, zero_grad, the running loss, then validation loss and accuracy. Interleaved repeats;
// prints one JSON object. ratio = loop time / Learner time (0.98 = the Learner is 2% slower).
#include <fastlearn/data/image_dataloaders.h>
#include <fastlearn/learner/learner.h>
#include <fastlearn/learner/progress.h>
#include <fastlearn/models/models.h>

#include <fmt/format.h>
#include <torch/torch.h>

#include <chrono>
#include <cstdio>
#include <vector>

#include "support/epoch_vs_python.h"
#include "support/result_row.h"

namespace fl = fastlearn;
using Clock = std::chrono::steady_clock;

namespace {

constexpr int kRepeats = 7;
constexpr std::int64_t kBatch = 128, kTrainItems = 100 * kBatch, kValidItems = 2048;

fl::DataLoaders subset(const fl::DataLoaders& full) { return bench::first_items(full, kTrainItems, kValidItems); }

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// What a user writes by hand for one epoch with validation.
double hand_loop(torch::nn::Sequential& model, fl::Optimizer& opt, fl::DataLoaders& dls, double& valid_acc) {
  const auto start = Clock::now();
  model->train();
  double loss_sum = 0;
  std::int64_t seen = 0;
  for (const auto& b : dls.train()) {
    auto loss = torch::nn::functional::cross_entropy(model->forward(b.inputs[0]), b.targets[0]);
    loss.backward();
    opt.step();
    opt.zero_grad();
    loss_sum += loss.item<double>() * static_cast<double>(b.size());
    seen += b.size();
  }
  torch::NoGradGuard no_grad;
  model->eval();
  double valid_loss = 0;
  std::int64_t correct = 0, n = 0;
  for (const auto& b : dls.valid()) {
    auto out = model->forward(b.inputs[0]);
    valid_loss +=
        torch::nn::functional::cross_entropy(out, b.targets[0]).item<double>() * static_cast<double>(b.size());
    correct += out.argmax(1).eq(b.targets[0]).sum().item<std::int64_t>();
    n += b.size();
  }
  valid_acc = static_cast<double>(correct) / static_cast<double>(n);
  if (seen == 0 || loss_sum < 0 || valid_loss < 0) std::abort();  // the losses are computed as the Learner does
  return seconds_since(start);
}

}  // namespace

int main(int argc, char** argv) {
  const std::string dir = argc > 1 ? argv[1] : "/usr/share/datasets/fashion-mnist";
  auto full = fl::ImageDataLoaders::from_idx(dir, {.bs = kBatch, .seed = 0});
  auto learner_dls = subset(full);
  auto loop_dls = subset(full);

  torch::manual_seed(0);
  auto learner_model = fl::models::simple_cnn(10);
  auto loop_model = fl::models::simple_cnn(10);
  std::FILE* devnull = std::fopen("/dev/null", "w");
  fl::Learner learn(learner_dls, learner_model, fl::cross_entropy(),
                    {.opt_func = fl::Adam(),
                     .metrics = {fl::accuracy()},
                     .cbs = {std::make_shared<fl::Progress>(fl::ProgressOptions{.out = devnull})},
                     .progress = false});
  auto loop_opt = fl::Adam()({loop_model->parameters()}, 1e-3);
  loop_opt->exempt_from_weight_decay(fl::norm_bias_params(*loop_model));  // as the Learner's optimizer

  double acc = 0;
  learn.fit(1, 1e-3);  // warm-up both sides
  hand_loop(loop_model, *loop_opt, loop_dls, acc);
  std::vector<double> ours, anchor;
  for (int r = 0; r < kRepeats; ++r) {
    auto start = Clock::now();
    learn.fit(1, 1e-3);
    ours.push_back(seconds_since(start));
    anchor.push_back(hand_loop(loop_model, *loop_opt, loop_dls, acc));
  }
  const auto o = bench::summarize(ours), a = bench::summarize(anchor);
  const auto row = bench::Row("learner_overhead", o, a, "s/epoch", false, 4)
                       .set("ratio", a.median / o.median, 4)  // 4 decimals, as this row always had
                       .set("threads", at::get_num_threads())
                       .set("repeats", kRepeats)
                       .set("learner_valid_accuracy", learn.validate().metric("accuracy"), 4)
                       .set("loop_valid_accuracy", acc, 4)
                       .set("what",
                            "Learner.fit(1) with TrainEval+Recorder+Progress vs a hand-written loop; simple_cnn, 100 "
                            "batches of 128 + 2048 valid, same loaders and Adam");
  fmt::print("{}\n", bench::results_line({row}));
  std::fclose(devnull);
  return 0;
}
