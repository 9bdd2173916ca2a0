// segmentation_vs_fastai: seconds per epoch of fit_one_cycle training fastai's U-Net (resnet18 body, no pretrained
// weights) on the shapes of scripts/make-shapes (64 x 64 RGB noise with circles and squares, 3 classes), validation
// included: SegmentationDataLoaders::from_folders + unet_learner against fastai's SegmentationDataLoaders +
// unet_learner (bench/python/segmentation_fastai.py) on the same files, RandomSplitter(0.2, seed 42) split, Resize(64),
// no augmentation or normalization, batch 16, Adam at fastai's defaults, 2 torch threads and no loader workers on both
// sides. Each seed trains once on each side, alternating (torch seeded with it on both: the initialisation and the
// shuffling differ between the sides all the same); the figure is the median seconds per epoch with the range, and the
// validation dice_multi of each side (goal: our median within 0.02 of fastai's, or above). The time one pass over the
// training loader takes alone is reported apart (load_seconds). Prints one JSON object. Goal: ratio >= 1.3.
// usage: bench_segmentation_vs_fastai [--images N] [--epochs E] [--seeds S] [--profile DIR]
//   --profile DIR: instead, one fit of each side under the profiler, traces DIR/segmentation_{ours,anchor}.json, and
//   the operators of each by their own time (segmentation_fastai.py top).
#include <fastlearn/data/segmentation_dataloaders.h>
#include <fastlearn/learner/recorder.h>
#include <fastlearn/learner/segmentation_metrics.h>
#include <fastlearn/learner/unet_learner.h>

#include <fmt/format.h>
#include <torch/csrc/autograd/profiler_kineto.h>
#include <torch/torch.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <set>
#include <string>

#include "support/bench_support.h"
#include "support/result_row.h"
#include "support/source_dir.h"

namespace fl = fastlearn;
namespace fs = std::filesystem;

namespace {

constexpr double kLr = 2e-3;
constexpr std::int64_t kBs = 16;

void trace_to(const std::string& path, const std::function<void()>& work) {
  namespace prof = torch::autograd::profiler;
  using torch::profiler::impl::ActivityType;
  const torch::profiler::impl::ProfilerConfig config(torch::profiler::impl::ProfilerState::KINETO,
                                                     /*report_input_shapes=*/true);
  const std::set<ActivityType> activities{ActivityType::CPU};
  prof::prepareProfiler(config, activities);
  prof::enableProfiler(config, activities);
  work();
  prof::disableProfiler()->save(path);
}

}  // namespace

int main(int argc, char** argv) {
  const int images = bench::int_flag(argc, argv, "--images", 300), epochs = bench::int_flag(argc, argv, "--epochs", 4);
  const int seeds = bench::int_flag(argc, argv, "--seeds", 3);
  std::string profile;
  for (int i = 1; i + 1 < argc; ++i)
    if (std::string(argv[i]) == "--profile") profile = argv[i + 1];
  const auto dir = fs::temp_directory_path() / fmt::format("fastlearn-shapes-{}", ::getpid());
  const std::string python = FASTLEARN_PYTHON, source = FASTLEARN_SOURCE_DIR;
  if (std::system(fmt::format("'{}' '{}/scripts/make-shapes' '{}' --count {} >&2", python, source, dir.string(), images)
                      .c_str()) != 0) {
    fmt::print(stderr, "bench_segmentation_vs_fastai: making the shapes failed (numpy and Pillow installed?)\n");
    return 1;
  }
  torch::set_num_threads(2);
  auto dls =
      fl::SegmentationDataLoaders::from_folders(dir / "images", dir / "masks", {"background", "circle", "square"},
                                                {.bs = kBs,
                                                 .num_workers = 0,
                                                 .seed = 0,
                                                 .size = 64,
                                                 .flip_p = 0,
                                                 .normalize = fl::ImageNormalization::none,
                                                 .valid_pct = 0.2,
                                                 .split_seed = 42});
  double dice = 0;
  auto ours_fit = [&](int seed, int n_epochs) {
    torch::manual_seed(static_cast<std::uint64_t>(seed));
    auto learn =
        fl::unet_learner(dls, {.arch = "resnet18"}, std::nullopt, {.metrics = {fl::dice_multi()}, .progress = false});
    const auto start = bench::Clock::now();
    learn->fit_one_cycle(n_epochs, kLr);
    const double seconds = bench::seconds_since(start);
    dice = learn->recorder().last_valid_metrics().at(0);
    return seconds / n_epochs;
  };
  bench::Coprocess theirs({python, source + "/bench/python/segmentation_fastai.py", "serve", dir.string(),
                           std::to_string(kBs), fmt::format("{}", kLr)});
  if (theirs.read_line() != "ready") return 1;
  double their_dice = 0;
  auto their_fit = [&](int seed, int n_epochs) {
    const auto reply = bench::numbers(theirs.request(fmt::format("fit {} {}", seed, n_epochs)), 2);
    their_dice = reply[1];
    return reply[0] / n_epochs;
  };
  if (!profile.empty()) {
    fs::create_directories(profile);
    const auto ours_trace = (fs::path(profile) / "segmentation_ours.json").string();
    const auto their_trace = (fs::path(profile) / "segmentation_anchor.json").string();
    ours_fit(0, 1);  // warm-up
    trace_to(ours_trace, [&] { ours_fit(0, 1); });
    theirs.request(fmt::format("fit 0 1"));
    theirs.request(fmt::format("profile 1 {}", their_trace));
    fs::remove_all(dir);
    return std::system(fmt::format("'{}' '{}/bench/python/segmentation_fastai.py' top '{}' '{}'", python, source,
                                   ours_trace, their_trace)
                           .c_str()) == 0
               ? 0
               : 1;
  }
  ours_fit(0, 1), their_fit(0, 1);  // warm-up: allocator, lazy initialization
  std::vector<double> ours, anchor, ours_dice, anchor_dice, ours_load, anchor_load;
  for (int seed = 0; seed < seeds; ++seed) {
    ours.push_back(ours_fit(seed, epochs));
    ours_dice.push_back(dice);
    anchor.push_back(their_fit(seed, epochs));
    anchor_dice.push_back(their_dice);
    const auto start = bench::Clock::now();
    for (auto& batch : dls.train()) static_cast<void>(batch);
    ours_load.push_back(bench::seconds_since(start));
    anchor_load.push_back(bench::numbers(theirs.request("load"), 1)[0]);
  }
  fs::remove_all(dir);
  const auto o = bench::summarize(ours), a = bench::summarize(anchor);
  const auto row = bench::Row("segmentation_vs_fastai", o, a, "s/epoch", /*higher_is_better=*/false, 3)
                       .set("seeds", seeds)
                       .set("images", images)
                       .set("epochs", epochs)
                       .set("bs", kBs)
                       .stats("ours_dice_multi", bench::summarize(ours_dice), 4)
                       .stats("anchor_dice_multi", bench::summarize(anchor_dice), 4)
                       .stats("ours_load_seconds", bench::summarize(ours_load), 3)
                       .stats("anchor_load_seconds", bench::summarize(anchor_load), 3)
                       .set("what",
                            "fit_one_cycle of unet_learner(resnet18, no pretrained weights) on 64x64 shapes, 3 "
                            "classes: SegmentationDataLoaders vs fastai's, same split, bs 16, 2 threads, no workers");
  fmt::print("{}\n", bench::results_line({row}));
  return 0;
}
