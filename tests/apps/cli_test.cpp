// The `fastlearn` command line as a user runs it.
#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <string>

#include "support/build_paths.h"
#include "support/processes.h"

namespace {

using fastlearn::testing::run_cli;

TEST(Cli, VersionNamesFastlearnLibtorchAndTheCompiledInBackends) {
  const auto r = run_cli("--version");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("fastlearn 0."), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("LibTorch " FASTLEARN_EXPECTED_TORCH), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("CUDA: yes (CUDA " FASTLEARN_EXPECTED_CUDA), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("NCCL: yes (library 2."), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("Gloo: yes"), std::string::npos) << r.output;
}

TEST(Cli, AnUnknownOptionIsAnErrorThatNamesIt) {
  const auto r = run_cli("--no-such-flag");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("--no-such-flag"), std::string::npos) << r.output;
}

TEST(Cli, HelpDescribesVersion) {
  const auto r = run_cli("--help");
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_NE(r.output.find("--version"), std::string::npos) << r.output;
}

}  // namespace
