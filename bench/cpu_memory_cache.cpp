// cpu_memory_cache: training images/s of resnet18 at 128 px (vision_learner, channels-last, batch 32, Adam,
// 2 torch threads, 8 batches of seeded random images per epoch) with fastlearn's CPU memory cache on
// against the same run with it off (FASTLEARN_CPU_MEMORY_CACHE_MB=0). The cache is process-wide, so each
// run is a child process of this one; the runs alternate between the two settings. The figure is the median,
// with the range. Prints one JSON object. Goal: ratio >= 1.05.
// usage: bench_cpu_memory_cache [--child]
#include <fastlearn/data/dataloaders.h>
#include <fastlearn/learner/vision_learner.h>

#include <fmt/format.h>
#include <torch/torch.h>

#include <filesystem>
#include <string>

#include "support/bench_support.h"
#include "support/result_row.h"

namespace fl = fastlearn;

namespace {

// One child run: prints the training images/s of its second epoch (the first warms up the allocator).
int child() {
  torch::set_num_threads(2);
  torch::manual_seed(0);
  const std::int64_t bs = 32, n = 8 * bs;
  auto ds = std::make_shared<fl::TensorDataset>(std::vector<at::Tensor>{torch::randn({n, 3, 128, 128})},
                                                std::vector<at::Tensor>{torch::randint(8, {n})});
  std::vector<std::string> vocab;
  for (int c = 0; c < 8; ++c) vocab.push_back(fmt::format("class{}", c));
  fl::DataLoaders dls(fl::DataLoader(ds, {.bs = bs, .shuffle = true, .drop_last = true, .seed = 0}),
                      fl::DataLoader(ds, {.bs = bs}), vocab);
  auto learn = fl::vision_learner(dls, {.arch = "resnet18"}, {.progress = false});
  learn->fit(1, 1e-3);
  const auto start = bench::Clock::now();
  learn->fit(1, 1e-3);
  fmt::print("{}\n", static_cast<double>(n) / bench::seconds_since(start));
  return 0;
}

double run_child(const std::string& self, bool cache) {
  return bench::command_figures(fmt::format("{}'{}' --child", cache ? "" : "FASTLEARN_CPU_MEMORY_CACHE_MB=0 ", self),
                                1)[0];
}

}  // namespace

int main(int argc, char** argv) {
  if (bench::has_flag(argc, argv, "--child")) return child();
  const int repeats = bench::repeats(5);
  const std::string self = std::filesystem::read_symlink("/proc/self/exe").string();  // not the shell's
  std::vector<double> on, off;
  for (int r = 0; r < repeats; ++r) {
    off.push_back(run_child(self, false));
    on.push_back(run_child(self, true));
  }
  const auto o = bench::summarize(on), a = bench::summarize(off);
  fmt::print("{}\n", bench::results_line({bench::Row("cpu_memory_cache", o, a, "images/s", true, 2)
                                              .set("repeats", repeats)
                                              .set("what",
                                                   "resnet18 at 128 px, batch 32, channels-last, 2 threads: training "
                                                   "with the CPU memory cache (ours) vs without it "
                                                   "(FASTLEARN_CPU_MEMORY_CACHE_MB=0), alternating child processes")}));
  return 0;
}
