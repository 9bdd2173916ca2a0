// The distributed example apps, started by `fastlearn launch` as a user would: the tutorial's ring
// allreduce on 3 ranks and its synchronous SGD on 2 ranks.
#include <gtest/gtest.h>

#include <cstdio>
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
