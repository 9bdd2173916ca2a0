// dataloader_throughput: samples/s the DataLoader delivers over Fashion-MNIST (gather + uint8 -> float +
// normalize, batch 128) against the samples/s one training process consumes (simple_cnn, forward +
// backward + AdamW step, batch 128), measured side by side in one run. Prints one JSON object.
#include <fastlearn/data/image_dataloaders.h>
#include <fastlearn/models/models.h>

#include <fmt/format.h>
#include <torch/torch.h>

#include <chrono>
#include <vector>

#include "support/bench_support.h"
#include "support/result_row.h"

namespace fl = fastlearn;
using Clock = std::chrono::steady_clock;

namespace {

constexpr int kRepeats = 5;
constexpr std::int64_t kBatch = 128;

// One full epoch of the loader; samples per second.
double loader_rate(fl::DataLoader& dl) {
  const auto start = Clock::now();
  std::int64_t samples = 0;
  for (const auto& b : dl) samples += b.size();
  return samples / std::chrono::duration<double>(Clock::now() - start).count();
}

double training_rate(torch::nn::Sequential& model, torch::optim::Optimizer& opt, const fl::Batch& batch, int steps) {
  const auto start = Clock::now();
  for (int i = 0; i < steps; ++i) {
    auto loss = torch::nn::functional::cross_entropy(model->forward(batch.inputs[0]), batch.targets[0]);
    opt.zero_grad();
    loss.backward();
    opt.step();
  }
  return steps * kBatch / std::chrono::duration<double>(Clock::now() - start).count();
}

}  // namespace

int main(int argc, char** argv) {
  const std::string dir = argc > 1 ? argv[1] : "/usr/share/datasets/fashion-mnist";
  auto dls = fl::ImageDataLoaders::from_idx(dir, {.bs = kBatch, .num_workers = 0, .seed = 0});
  auto threaded = fl::ImageDataLoaders::from_idx(dir, {.bs = kBatch, .num_workers = 2, .seed = 0});
  torch::manual_seed(0);
  auto model = fl::models::simple_cnn(dls.c());
  torch::optim::AdamW opt(model->parameters(), torch::optim::AdamWOptions(1e-3));
  const auto batch = dls.train().one_batch();

  loader_rate(dls.train());  // warm-up: page in the data, settle the allocator
  training_rate(model, opt, batch, 5);
  std::vector<double> ours, ours_threaded, anchor;
  for (int r = 0; r < kRepeats; ++r) {  // interleaved, so both sides see the same machine state
    ours.push_back(loader_rate(dls.train()));
    ours_threaded.push_back(loader_rate(threaded.train()));
    anchor.push_back(training_rate(model, opt, batch, 30));
  }
  const auto o = bench::summarize(ours), w = bench::summarize(ours_threaded), a = bench::summarize(anchor);
  // The ratio with 2 decimals, as this benchmark has always reported it.
  fmt::print("{}\n", bench::results_line({bench::Row("dataloader_throughput", o, a, "samples/s", true, 1)
                                              .set("ratio", o.median / a.median, 2)
                                              .set("ours_2_workers", w.median, 1)
                                              .set("threads", at::get_num_threads())
                                              .set("repeats", kRepeats)
                                              .set("what",
                                                   "DataLoader (0 workers, bs 128: gather, to float, normalize) vs "
                                                   "simple_cnn training consumption")}));
  return 0;
}
