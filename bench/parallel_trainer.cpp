// parallel_trainer: one epoch (60 training batches of 256 + 2048 validation items) of conv_net on Fashion-MNIST
// through Learner.fit, trained by 2 CPU replicas of one process (ParallelCtx: a thread each, 1 intra-op thread
// each) against the same Learner in one process of 2 intra-op threads; same global batch, data, model and Adam.
// Interleaved repeats; prints one JSON object. ratio = one-process time / replicas time (above 1: the replicas are
// faster). On several GPUs the figure to measure is the replicas' samples/s against DistributedTrainer's on the same
// GPUs (bench_gpu's replicas row measures 2 replicas on one GPU against one).
#include <fastlearn/data/image_dataloaders.h>
#include <fastlearn/distributed/parallel_trainer.h>
#include <fastlearn/learner/learner.h>
#include <fastlearn/models/models.h>

#include <fmt/format.h>
#include <torch/torch.h>

#include "support/epoch_vs_python.h"
#include "support/result_row.h"

namespace fl = fastlearn;

namespace {

constexpr std::int64_t kBatch = 256, kTrainItems = 60 * kBatch, kValidItems = 2048;

fl::DataLoaders subset(const fl::DataLoaders& full) { return bench::first_items(full, kTrainItems, kValidItems); }

std::unique_ptr<fl::Learner> learner(const fl::DataLoaders& full) {
  torch::manual_seed(0);
  return std::make_unique<fl::Learner>(
      subset(full), fl::models::conv_net(), fl::cross_entropy(),
      fl::LearnerOptions{
          .opt_func = fl::Adam(), .metrics = {fl::accuracy()}, .progress = false, .device = c10::Device(c10::kCPU)});
}

}  // namespace

int main(int argc, char** argv) {
  const std::string dir = argc > 1 ? argv[1] : "/usr/share/datasets/fashion-mnist";
  try {
    const int n = bench::repeats(5);
    const int threads = at::get_num_threads();
    auto full = fl::ImageDataLoaders::from_idx(dir, {.bs = kBatch, .seed = 0});
    auto one = learner(full);
    auto replicas = learner(full);
    fl::ParallelCtx ctx(*replicas, {c10::Device(c10::kCPU), c10::Device(c10::kCPU)});
    one->fit(1, 1e-3);  // warm-up both sides
    replicas->fit(1, 1e-3);
    std::vector<double> ours, anchor;
    for (int r = 0; r < n; ++r) {
      auto start = bench::Clock::now();
      replicas->fit(1, 1e-3);
      ours.push_back(bench::seconds_since(start));
      start = bench::Clock::now();
      one->fit(1, 1e-3);
      anchor.push_back(bench::seconds_since(start));
    }
    const auto o = bench::summarize(ours), a = bench::summarize(anchor);
    // The ratio keeps the 4 decimals this row has always had.
    const auto row =
        bench::Row("parallel_trainer", o, a, "s/epoch", /*higher_is_better=*/false, 4)
            .set("ratio", a.median / o.median, 4)
            .set("threads", threads)
            .set("repeats", n)
            .set("replicas_valid_accuracy", replicas->validate().metric("accuracy"), 4)
            .set("one_process_valid_accuracy", one->validate().metric("accuracy"), 4)
            .set("what", fmt::format("Learner.fit(1) of conv_net on 2 CPU replicas of one process (ParallelCtx, 1 "
                                     "thread each) vs one process of {} threads; 60 batches of 256 + 2048 valid, Adam",
                                     threads));
    fmt::print("{}\n", bench::results_line({row}));
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "parallel_trainer: " << e.what() << "\n";
    return 1;
  }
}
