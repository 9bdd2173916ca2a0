// dataloader_throughput: samples/s the DataLoader delivers over Fashion-MNIST (gather + uint8 -> float +
// normalize, batch 128) against the samples/s one training process consumes (simple_cnn, forward +
// backward + AdamW step, batch 128), measured side by side in one run. Prints one JSON object.
#include <fastlearn/data/image_dataloaders.h>
#include <fastlearn/models/models.h>

#include <fmt/format.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <vector>

namespace fl = fastlearn;
using Clock = std::chrono::steady_clock;

namespace {

constexpr int kRepeats = 5;
constexpr std::int64_t kBatch = 128;

struct Stats {
  double median, min, max;
};

Stats summarize(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return {v[v.size() / 2], v.front(), v.back()};
}

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
  const auto o = summarize(ours), w = summarize(ours_threaded), a = summarize(anchor);
  fmt::print(
      R"({{"dataloader_throughput": {{"ours": {:.1f}, "anchor": {:.1f}, "ratio": {:.2f}, "unit": "samples/s", )"
      R"("higher_is_better": true, "ours_range": [{:.1f}, {:.1f}], "anchor_range": [{:.1f}, {:.1f}], )"
      R"("ours_2_workers": {:.1f}, "threads": {}, "repeats": {}, )"
      R"("what": "DataLoader (0 workers, bs 128: gather, to float, normalize) vs simple_cnn training consumption"}}}})"
      "\n",
      o.median, a.median, o.median / a.median, o.min, o.max, a.min, a.max, w.median, at::get_num_threads(), kRepeats);
  return 0;
}
