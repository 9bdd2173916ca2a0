// loader_workers: does a fit train faster with loader worker threads than without, in one process of 2 threads?
// Two rows, the epochs of each interleaved (workers 0, 1, 2 in turn), median and range of FASTLEARN_BENCH_REPEATS
// (default 3) epochs each:
//   loader_workers         Fashion-MNIST (Debian's copy), simple_cnn, bs 128, Adam, one fit_one_cycle epoch with
//                          validation: decoding is nothing (uint8 in memory), so workers can only cost.
//   loader_workers_images  512 photo-sized JPEG files in 8 folders (bench/python/image_pipeline.py make), decoded and
//                          cropped to 64x64, conv_net on 3 channels, bs 64: decoding is real work, which workers
//                          should take off the training thread.
// ours: seconds per epoch with 1 worker; anchor: with 0 (loading on the training thread); ratio = anchor / ours
// (> 1: the worker made the epoch faster); "workers_2" the same with 2 workers. Goal: ratio >= 1.0 on both rows.
#include <fastlearn/core/random.h>
#include <fastlearn/data/image_dataloaders.h>
#include <fastlearn/data/untar_data.h>
#include <fastlearn/learner/learner.h>
#include <fastlearn/models/models.h>

#include <fmt/format.h>
#include <torch/torch.h>
#include <unistd.h>

#include <array>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "support/bench_support.h"
#include "support/result_row.h"
#include "support/source_dir.h"

namespace fl = fastlearn;
namespace fs = std::filesystem;

namespace {

// Seconds of one epoch (training and validation) of a fresh Learner on the loaders `make(workers)` gives.
using Model = std::function<torch::nn::Sequential(std::int64_t classes)>;

double epoch_seconds(const std::function<fl::DataLoaders(int)>& make, int workers, const Model& model) {
  fl::set_seed(0);
  auto dls = make(workers);
  fl::Learner learn(dls, model(dls.c()), fl::cross_entropy(), {.progress = false, .device = torch::kCPU});
  const auto start = bench::Clock::now();
  learn.fit_one_cycle(1, 3e-3);
  return bench::seconds_since(start);
}

// The row: every repeat runs workers 0, 1 and 2 in turn.
bench::Row row(const std::string& name, const std::function<fl::DataLoaders(int)>& make, const Model& model,
               int repeats, const std::string& what) {
  epoch_seconds(make, 1, model);  // warm-up (files in the page cache, allocator)
  std::array<std::vector<double>, 3> seconds;
  for (int r = 0; r < repeats; ++r)
    for (int w = 0; w < 3; ++w) seconds[static_cast<std::size_t>(w)].push_back(epoch_seconds(make, w, model));
  const auto none = bench::summarize(seconds[0]), one = bench::summarize(seconds[1]),
             two = bench::summarize(seconds[2]);
  return bench::Row(name, one, none, "s/epoch", false, 3)
      .stats("workers_2", two, 3)
      .set("ratio_workers_2", none.median / two.median, 3)
      .set("threads", at::get_num_threads())
      .set("repeats", repeats)
      .set("what", what);
}

}  // namespace

int main(int argc, char** argv) {
  const int repeats = bench::repeats(3);
  torch::set_num_threads(2);
  const auto idx = fl::untar_data(fl::urls::fashion_mnist());
  const auto fashion_loaders = [&](int workers) {
    return fl::ImageDataLoaders::from_idx(idx, {.bs = 128, .num_workers = workers, .seed = 0});
  };
  const auto simple_cnn = [](std::int64_t classes) { return fl::models::simple_cnn(classes); };
  if (const int workers = bench::int_flag(argc, argv, "--fashion-epoch", -1); workers >= 0) {
    // One Fashion-MNIST epoch with that many workers, for a profiler: bench_loader_workers --fashion-epoch 1
    fmt::print("{:.3f} s\n", epoch_seconds(fashion_loaders, workers, simple_cnn));
    return 0;
  }
  const auto fashion =
      row("loader_workers", fashion_loaders, simple_cnn, repeats,
          "one epoch of simple_cnn on Fashion-MNIST, bs 128, 2 threads: seconds with 1 loader worker (ours) and 0 "
          "(anchor)");

  const auto dir = fs::temp_directory_path() / fmt::format("fastlearn-loader-workers-{}", ::getpid());
  const std::string script = std::string(FASTLEARN_SOURCE_DIR) + "/bench/python/image_pipeline.py";
  if (std::system(fmt::format("'{}' '{}' make '{}' 512 >&2", FASTLEARN_PYTHON, script, dir.string()).c_str()) != 0) {
    fmt::print(stderr, "bench_loader_workers: making the JPEG files failed (scikit-image installed?)\n");
    return 1;
  }
  const auto images = row(
      "loader_workers_images",
      [&](int workers) {
        return fl::ImageDataLoaders::from_folder(dir, {.bs = 64, .num_workers = workers, .seed = 0, .size = 64});
      },
      [](std::int64_t classes) {
        return fl::models::conv_net({.classes = classes, .in_channels = 3, .input_size = 64});
      },
      repeats,
      "one epoch of conv_net on 512 photo-sized JPEG files cropped to 64x64, bs 64, 2 threads: seconds with 1 "
      "loader worker (ours) and 0 (anchor)");
  fs::remove_all(dir);
  fmt::print("{}\n", bench::results_line({fashion, images}));
  return 0;
}
