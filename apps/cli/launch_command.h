#pragma once
// `fastlearn launch [options] -- program args...`: torchrun for any program. The subcommand's options and what it
// does with them, for both halves of the CLI: `fastlearn` (which runs the launch without loading LibTorch) and
// fastlearn-torch (everything else). No LibTorch here.
#include <fastlearn/launch/launcher.h>

#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace CLI {
class App;
}

namespace fastlearn::cli {

struct LaunchArgs {
  LaunchOptions options;
  std::optional<std::vector<std::string>>
      after_dashes;  // after the first "--": kept from CLI11, which would read them as its options
  std::string log_dir;
  double grace_seconds = 10;
  bool no_prefix = false;
  bool standalone = false;
  bool no_python = false;
};

/// Adds the `launch` subcommand, its options read into `a`.
CLI::App* add_launch(CLI::App& app, LaunchArgs& a);

/// launch() or one of its variants: what runs the ranks.
using LaunchFunction = std::function<LaunchResult(const LaunchOptions&)>;

/// After `launch` was parsed: checks the options, runs the ranks through `launch_function`, prints the summary of a
/// failure, and returns the exit code.
int run_launch(CLI::App& launch, LaunchArgs& a, const LaunchFunction& launch_function);

/// Keeps what follows the first "--" of the command line in a.after_dashes (CLI11 would read it as options) and
/// returns how many arguments CLI11 is to parse.
int split_at_dashes(int argc, char** argv, LaunchArgs& a);

}  // namespace fastlearn::cli
