// image_pipeline: images/s through the same per-image pipeline on both sides: decode a photo-sized JPEG
// (scaled decoding allowed: libjpeg-turbo's scales here, PIL's draft mode there), RandomResizedCrop to 224,
// horizontal flip, to float, normalize with ImageNet's statistics, collate to batches of 64. fastlearn's
// ImageDataLoaders::from_folder (worker threads) against torchvision's ImageFolder + DataLoader (worker
// processes), the same number of workers and one torch thread each, over the same files (made by
// bench/python/image_pipeline.py from the photos scikit-image ships). Epochs alternate between the sides;
// the figure is the median, with the range. Prints one JSON object. Goal: ratio >= 2.
// usage: bench_image_pipeline [--images N] [--workers W]
#include <fastlearn/data/image_dataloaders.h>

#include <fmt/format.h>
#include <torch/torch.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string>

#include "support/bench_support.h"
#include "support/result_row.h"
#include "support/source_dir.h"

namespace fl = fastlearn;
namespace fs = std::filesystem;

int main(int argc, char** argv) {
  const int images = bench::int_flag(argc, argv, "--images", 512),
            workers = bench::int_flag(argc, argv, "--workers", 2);
  const int repeats = bench::repeats(5);
  const auto dir = fs::temp_directory_path() / fmt::format("fastlearn-image-pipeline-{}", ::getpid());
  const std::string python = FASTLEARN_PYTHON,
                    script = std::string(FASTLEARN_SOURCE_DIR) + "/bench/python/image_pipeline.py";
  if (std::system(fmt::format("'{}' '{}' make '{}' {} >&2", python, script, dir.string(), images).c_str()) != 0) {
    fmt::print(stderr, "bench_image_pipeline: making the JPEG files failed (scikit-image installed?)\n");
    return 1;
  }
  torch::set_num_threads(1);
  auto dls = fl::ImageDataLoaders::from_folder(
      dir, {.bs = 64, .num_workers = workers, .seed = 0, .size = 224, .min_scale = 0.08, .flip_p = 0.5});
  auto ours_epoch = [&] {
    const auto start = bench::Clock::now();
    std::int64_t n = 0;
    for (const auto& batch : dls.train()) n += batch.size();
    return static_cast<double>(n) / bench::seconds_since(start);
  };
  bench::Coprocess theirs({python, script, "serve", dir.string(), std::to_string(workers)});
  if (theirs.read_line() != "ready") return 1;
  auto their_epoch = [&] {
    const auto reply = bench::numbers(theirs.request("epoch"), 2);  // seconds, images
    return reply[1] / reply[0];
  };
  ours_epoch(), their_epoch();  // warm-up: page cache, worker start-up
  std::vector<double> ours, anchor;
  for (int r = 0; r < repeats; ++r) {
    ours.push_back(ours_epoch());
    anchor.push_back(their_epoch());
  }
  fs::remove_all(dir);
  const auto o = bench::summarize(ours), a = bench::summarize(anchor);
  const auto row = bench::Row("image_pipeline", o, a, "images/s", true, 1)
                       .set("repeats", repeats)
                       .set("images", images)
                       .set("workers", workers)
                       .set("what",
                            "JPEG 300-500 px -> RandomResizedCrop 224, flip, float, normalize, batches of 64: "
                            "ImageDataLoaders::from_folder vs torchvision ImageFolder + DataLoader, PIL in draft mode");
  fmt::print("{}\n", bench::results_line({row}));
  return 0;
}
