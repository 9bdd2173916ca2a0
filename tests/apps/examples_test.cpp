// The example apps as a user runs them: the tutorial's ring allreduce on 3 ranks and its synchronous SGD on 2 ranks,
// started by `fastlearn launch`, and serve_export predicting image files from the export of a `fastlearn train` run.
#include <fastlearn/data/image_encode.h>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <torch/torch.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "support/build_paths.h"
#include "support/processes.h"

namespace {

using fastlearn::testing::run_shell;

// The CLI followed by `args` (appended: GCC 12 warns falsely on std::string(macro) + literal).
std::string cli(const std::string& args) {
  std::string command = FASTLEARN_CLI;
  command.append(" ").append(args);
  return command;
}

std::string bin(const char* name) {
  std::string path = FASTLEARN_BIN_DIR;
  path.append("/").append(name);
  return path;
}

}  // namespace

TEST(Examples, RingAllreduceOnThreeRanksMatchesAllReduce) {
  const auto [code, out] = run_shell(cli("launch --nproc-per-node 3 " + bin("ring_allreduce") + " --numel 100003"));
  EXPECT_EQ(code, 0) << out;
  for (int r = 0; r < 3; ++r) {
    EXPECT_NE(
        out.find("[rank " + std::to_string(r) + "] rank " + std::to_string(r) + " of 3: ring allreduce of 100003"),
        std::string::npos)
        << out;
  }
}

TEST(Examples, DistributedSgdKeepsTheReplicasIdentical) {
  if (FILE* f = std::fopen("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz", "r")) {
    std::fclose(f);
  } else {
    GTEST_SKIP() << "Debian's dataset-fashion-mnist is not installed";
  }
  const auto [code, out] = run_shell(cli("launch --nproc-per-node 2 " + bin("distributed_sgd") + " --epochs 1"));
  EXPECT_EQ(code, 0) << out;
  EXPECT_NE(out.find("rank 0: replicas identical: yes"), std::string::npos) << out;
  EXPECT_NE(out.find("rank 1: replicas identical: yes"), std::string::npos) << out;
}

// A Fashion-MNIST model trained by `fastlearn train` serves PNG files of other sizes through the example: the lines
// `fastlearn predict EXPORT` prints; a file that is not an image is an error naming it, with exit code 1.
TEST(Examples, ServeExportPredictsWhatTheCliPredicts) {
  if (FILE* f = std::fopen("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz", "r")) {
    std::fclose(f);
  } else {
    GTEST_SKIP() << "Debian's dataset-fashion-mnist is not installed";
  }
  const auto dir = std::filesystem::temp_directory_path() / fmt::format("fastlearn_serve_{}", ::getpid());
  std::filesystem::create_directories(dir);
  std::string files;
  for (int i = 0; i < 3; ++i) {
    const auto file = dir / fmt::format("{}.png", i);
    const auto image = torch::randint(0, 256, {3, 20 + 10 * i, 30}, torch::kInt32).to(torch::kUInt8);
    std::ofstream(file, std::ios::binary) << fastlearn::encode_png(image);
    files += " " + file.string();
  }
  const auto train =
      run_shell(cli(fmt::format("train {}/configs/fashion_mnist.toml --set train.epochs=1 --set "
                                "'model.arch=\"mlp\"' --set train.device=\"cpu\" --out {}",
                                FASTLEARN_SOURCE_DIR, (dir / "run").string())));
  ASSERT_EQ(train.first, 0) << train.second;
  const auto exported = (dir / "run" / "export.safetensors").string();
  const auto served = run_shell(bin("serve_export") + " " + exported + files);
  const auto predicted = run_shell(cli("predict " + exported + files));
  EXPECT_EQ(served.first, 0) << served.second;
  EXPECT_EQ(served.second, predicted.second);
  EXPECT_NE(served.second.find("0.png\t"), std::string::npos) << served.second;
  const auto bad = run_shell(bin("serve_export") + " " + exported + " " + FASTLEARN_SOURCE_DIR + "/README.md");
  EXPECT_EQ(bad.first, 1) << bad.second;
  EXPECT_NE(bad.second.find("serve_export: "), std::string::npos) << bad.second;
  EXPECT_NE(bad.second.find("README.md"), std::string::npos) << bad.second;
  std::filesystem::remove_all(dir);
}

// configs/regression_sharded.toml as its header says: 2 ranks, each keeping its share of Adam's state and of the
// gradients; its checkpoint after epoch 3 resumes in one process (the whole state is in the file) and the run ends.
TEST(Examples, TheShardedConfigTrainsOnTwoRanksAndResumesInOneProcess) {
  const auto dir = std::filesystem::temp_directory_path() / fmt::format("fastlearn_sharded_config_{}", ::getpid());
  std::filesystem::remove_all(dir);
  const auto config = fmt::format("{}/configs/regression_sharded.toml", FASTLEARN_SOURCE_DIR);
  const auto [code, out] =
      run_shell(cli(fmt::format("train {} --nproc-per-node 2 --out {}", config, (dir / "run").string())));
  ASSERT_EQ(code, 0) << out;
  EXPECT_NE(out.find("final validation set"), std::string::npos) << out;
  std::filesystem::remove(dir / "run" / "checkpoints" / "ckpt-e0004-b0000000.safetensors");
  const auto [resumed_code, resumed] =
      run_shell(cli(fmt::format("train {} --out {} --resume", config, (dir / "run").string())));
  ASSERT_EQ(resumed_code, 0) << resumed;
  EXPECT_NE(resumed.find("continuing from"), std::string::npos) << resumed;
  EXPECT_NE(resumed.find("ckpt-e0003"), std::string::npos) << resumed;
  EXPECT_NE(resumed.find("written by 2 rank(s) and this run has 1"), std::string::npos) << resumed;
  std::ifstream history(dir / "run" / "history.csv");
  std::string line, last;
  while (std::getline(history, line)) last = line;
  EXPECT_EQ(last.rfind("3,", 0), 0u) << "the last epoch (3) is in the history: " << last;
  std::filesystem::remove_all(dir);
}
