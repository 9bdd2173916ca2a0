// vision_fine_tune: training images/s of fine_tune(1) of a resnet18 at 128 px (one frozen epoch, then one
// unfrozen epoch, validation after each), fastlearn's vision_learner (channels-last by default; --contiguous
// for the default layout) against fastai's vision_learner (in its default layout),
// on the same JPEG files (bench/python/image_pipeline.py's photos, 8 classes), both starting from the same
// torchvision resnet18 state dict exported to safetensors (seeded random weights: no download on either
// side). The same items (Resize(128): random crop in training, centre crop in validation), batch
// transforms (flip and aug_transforms() with fastai's defaults, ImageNet normalization), batch size, Adam,
// 2 loader workers and 2 torch threads on both sides. Runs alternate between the sides, each from a new
// learner; the figure is the median, with the range. Prints one JSON object. Goal: ratio >= 1.5.
// usage: bench_vision_fine_tune [--images N] [--bs B] [--contiguous]
#include <fastlearn/data/image_dataloaders.h>
#include <fastlearn/learner/learner.h>
#include <fastlearn/learner/metrics.h>
#include <fastlearn/learner/recorder.h>
#include <fastlearn/learner/vision_learner.h>

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
  const int images = bench::int_flag(argc, argv, "--images", 256), bs = bench::int_flag(argc, argv, "--bs", 32);
  const int repeats = bench::repeats(5);
  const auto dir = fs::temp_directory_path() / fmt::format("fastlearn-vision-fine-tune-{}", ::getpid());
  const std::string python = FASTLEARN_PYTHON,
                    script = std::string(FASTLEARN_SOURCE_DIR) + "/bench/python/vision_fine_tune.py";
  if (std::system(fmt::format("'{}' '{}' make '{}' {} >&2", python, script, dir.string(), images).c_str()) != 0) {
    fmt::print(stderr, "bench_vision_fine_tune: making the files failed (scikit-image and fastai installed?)\n");
    return 1;
  }
  torch::set_num_threads(2);
  auto dls = fl::ImageDataLoaders::from_folder(
      dir, {.bs = bs, .num_workers = 2, .seed = 0, .size = 128, .flip_p = 0.5, .augment = fl::AugOptions{}});
  double accuracy = 0;
  const bool contiguous = bench::has_flag(argc, argv, "--contiguous");
  auto ours_run = [&] {
    auto learn = fl::vision_learner(
        dls, {.arch = "resnet18", .weights = dir / "resnet18.safetensors", .channels_last = !contiguous},
        {.metrics = {fl::accuracy()}, .progress = false});
    const auto start = bench::Clock::now();
    learn->fine_tune(1);
    const double seconds = bench::seconds_since(start);
    accuracy = learn->recorder().last_valid_metrics().at(0);
    return static_cast<double>(2 * dls.train().size() * bs) / seconds;  // two epochs of full batches
  };
  bench::Coprocess theirs({python, script, "serve", dir.string(), std::to_string(bs)});
  if (theirs.read_line() != "ready") return 1;
  double their_accuracy = 0;
  auto their_run = [&] {
    const auto reply = bench::numbers(theirs.request("run"), 3);  // seconds, images, accuracy
    their_accuracy = reply[2];
    return reply[1] / reply[0];
  };
  ours_run(), their_run();  // warm-up: page cache, worker start-up, allocator
  std::vector<double> ours, anchor;
  for (int r = 0; r < repeats; ++r) {
    ours.push_back(ours_run());
    anchor.push_back(their_run());
  }
  fs::remove_all(dir);
  const auto o = bench::summarize(ours), a = bench::summarize(anchor);
  const auto row =
      bench::Row("vision_fine_tune", o, a, "images/s", /*higher_is_better=*/true, 2)
          .set("repeats", repeats)
          .set("images", images)
          .set("bs", bs)
          .set("ours_last_accuracy", accuracy, 3)
          .set("anchor_last_accuracy", their_accuracy, 3)
          .set("what", fmt::format("fine_tune(1) of resnet18 at 128 px (frozen epoch + unfrozen epoch, validation "
                                   "included): vision_learner ({}) vs fastai vision_learner, same exported weights, "
                                   "aug_transforms, 2 threads",
                                   contiguous ? "contiguous" : "channels-last"));
  fmt::print("{}\n", bench::results_line({row}));
  return 0;
}
