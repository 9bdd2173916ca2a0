// The `fastlearn` command line as a user runs it.
#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <string>

namespace {

struct Run {
  int exit_code;
  std::string output;
};

Run run(const std::string& args) {
  std::string command = FASTLEARN_CLI;
  command.append(" ").append(args).append(" 2>&1");
  FILE* pipe = popen(command.c_str(), "r");
  if (!pipe) return {-1, "popen failed"};
  std::string out;
  std::array<char, 4096> buf{};
  while (auto n = fread(buf.data(), 1, buf.size(), pipe)) out.append(buf.data(), n);
  const int status = pclose(pipe);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
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
