// image_folder_two_ranks: the test accuracy `fastlearn train --nproc-per-node 2` reaches with torchvision's
// resnet18 (random initialization) on Fashion-MNIST written out as 28 px PNG class folders (all 60,000
// training and 10,000 test images, by scripts/make-image-folders), and the wall seconds it takes, start-up,
// decoding in the loader's workers and per-epoch validation included. The anchor is the goal, 90% test
// accuracy: no other library runs this exact pipeline here, so ratio = accuracy / 0.90 (>= 1 means reached).
// Prints one JSON object. usage: bench_image_folder_two_ranks [--epochs E]
#include <fmt/format.h>
#include <unistd.h>
#include <nlohmann/json.hpp>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "support/bench_support.h"
#include "support/result_row.h"
#include "support/source_dir.h"

namespace fs = std::filesystem;

int main(int argc, char** argv) {
  const int epochs = bench::int_flag(argc, argv, "--epochs", 3);
  const auto dir = fs::temp_directory_path() / fmt::format("fastlearn-image-folder-{}", ::getpid());
  const std::string python = FASTLEARN_PYTHON, source = FASTLEARN_SOURCE_DIR;
  if (std::system(fmt::format("'{}' '{}/scripts/make-image-folders' '{}' --train 6000 --valid 1000 >&2", python, source,
                              dir.string())
                      .c_str()) != 0) {
    fmt::print(stderr, "bench_image_folder_two_ranks: making the PNG folders failed (numpy and Pillow installed?)\n");
    return 1;
  }
  std::ofstream(dir / "run.toml") << fmt::format(R"([data]
dataset = "image_folder"
path = "{}"
size = 28
bs = 64
workers = 1
[model]
arch = "resnet18"
[train]
epochs = {}
lr = 3e-3
seed = 0
[output]
checkpoints = false
)",
                                                 (dir / "png").string(), epochs);
  const auto bin = fs::canonical("/proc/self/exe").parent_path();
  const auto command = fmt::format("OMP_NUM_THREADS=1 '{}/fastlearn' train '{}' --out '{}' --nproc-per-node 2 >&2",
                                   bin.string(), (dir / "run.toml").string(), (dir / "out").string());
  const auto start = bench::Clock::now();
  const int status = std::system(command.c_str());
  const double seconds = bench::seconds_since(start);
  if (status != 0) {
    fmt::print(stderr, "bench_image_folder_two_ranks: the training run failed: {}\n", command);
    return 1;
  }
  const auto metrics = nlohmann::json::parse(std::ifstream(dir / "out" / "metrics.json"));
  const double accuracy = metrics.back()["accuracy"];
  auto per_epoch = nlohmann::ordered_json::array();
  for (const auto& record : metrics) per_epoch.push_back(bench::rounded(record["accuracy"].get<double>(), 4));
  fs::remove_all(dir);
  // The anchor is a goal, not a measurement: no ranges, so not a bench::Row.
  nlohmann::ordered_json row;
  row["ours"] = bench::rounded(accuracy, 4);
  row["anchor"] = 0.90;
  row["ratio"] = bench::rounded(accuracy / 0.90, 3);
  row["unit"] = "test accuracy";
  row["higher_is_better"] = true;
  row["anchor_is"] = "the goal: 90% test accuracy";
  row["seconds"] = bench::rounded(seconds, 1);
  row["epochs"] = epochs;
  row["accuracy_per_epoch"] = per_epoch;
  row["what"] =
      "fastlearn train --nproc-per-node 2: torchvision resnet18 on Fashion-MNIST as 28 px PNG folders (60k train, "
      "10k test), bs 64 per rank, one_cycle Adam lr 3e-3";
  nlohmann::ordered_json line;
  line["image_folder_two_ranks"] = row;
  fmt::print("{}\n", line.dump());
  return 0;
}
