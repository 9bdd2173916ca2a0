// The `fastlearn` command line as a user runs it.
#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <string>

#include "support/build_paths.h"
#include "support/processes.h"

namespace {

struct Run {
  int exit_code;
  std::string output;
};

// The CLI with `args` (appended: GCC 12 warns falsely on std::string(macro) + literal).
Run run(const std::string& args) {
  std::string command = FASTLEARN_CLI;
  auto [code, out] = fastlearn::testing::run_shell(command.append(" ").append(args));
  return {code, std::move(out)};
}

TEST(Cli, VersionNamesFastlearnLibtorchAndTheCompiledInBackends) {
  const auto r = run("--version");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("fastlearn 0."), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("LibTorch " FASTLEARN_EXPECTED_TORCH), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("CUDA: yes (CUDA " FASTLEARN_EXPECTED_CUDA), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("NCCL: yes (library 2."), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("Gloo: yes"), std::string::npos) << r.output;
}

TEST(Cli, AnUnknownOptionIsAnErrorThatNamesIt) {
  const auto r = run("--no-such-flag");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("--no-such-flag"), std::string::npos) << r.output;
}

TEST(Cli, HelpDescribesVersion) {
  const auto r = run("--help");
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_NE(r.output.find("--version"), std::string::npos) << r.output;
}

}  // namespace
