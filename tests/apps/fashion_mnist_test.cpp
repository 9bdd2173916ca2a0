// The acceptance run of the single-process Learner on real data: build/bin/fashion_mnist trains
// simple_cnn for 3 epochs of fit_one_cycle on Fashion-MNIST and must reach >= 90% test accuracy,
// writing metrics.json, the CSV log, the loss plot and a checkpoint into --out.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "support/build_paths.h"

namespace fs = std::filesystem;

TEST(FashionMnist, SimpleCnnReaches90PercentInThreeEpochs) {
  const fs::path data = "/usr/share/datasets/fashion-mnist";
  if (!fs::exists(data / "train-images-idx3-ubyte.gz"))
    GTEST_SKIP() << "Debian's dataset-fashion-mnist is not installed";
  const auto out = fs::temp_directory_path() / ("fastlearn-fashion-" + std::to_string(getpid()));
  const std::string command = std::string(FASTLEARN_FASHION_APP) + " --epochs 3 --out " + out.string() + " > " +
                              (out.string() + ".log") + " 2>&1";
  ASSERT_EQ(std::system(command.c_str()), 0) << "see " << out << ".log";
  std::ifstream in(out / "metrics.json");
  auto records = nlohmann::json::parse(in);
  ASSERT_EQ(records.size(), 3u);
  const double accuracy = records.back()["accuracy"].get<double>();
  EXPECT_GE(accuracy, 0.90);
  for (const char* file : {"history.csv", "loss.svg", "models/fashion_cnn.safetensors"}) {
    EXPECT_TRUE(fs::exists(out / file)) << file;
  }
  std::cout << "[ fashion  ] test accuracy " << accuracy << "\n";
  fs::remove_all(out);
  fs::remove(out.string() + ".log");
}
