// The fastlearn command line. This program loads no LibTorch, whose start-up costs a second or two per process:
// `fastlearn launch` runs here, starting the ranks at once (rank 0 serves the rendezvous store on the socket the
// launcher holds: launch/detail/launch_serving.h); every other subcommand, --help and --version run in fastlearn-torch,
// which this program becomes (exec). It sits next to this program (the build tree) or in <prefix>/libexec/fastlearn
// (an install).
#include <fastlearn/core/error.h>
#include <fastlearn/launch/detail/launch_serving.h>

#include "cli/launch_command.h"

#include <fmt/format.h>
#include <unistd.h>
#include <CLI/CLI.hpp>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <string_view>

namespace fs = std::filesystem;

namespace {

// A helper program of this one: next to it (the build tree), else where an install puts it.
fs::path helper(std::string_view name) {
  const auto self = fs::read_symlink("/proc/self/exe");
  const auto beside = self.parent_path() / name;
  const auto installed = (self.parent_path() / FASTLEARN_HELPERS_FROM_BINDIR / name).lexically_normal();
  for (const auto& candidate : {beside, installed}) {
    if (access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  throw fastlearn::ConfigError(fmt::format("cannot find {} beside {} or in {} (an incomplete install of fastlearn?)",
                                           name, self.string(), installed.parent_path().string()));
}

int launch_main(int argc, char** argv) {
  CLI::App app{"fastlearn: fastai-style training over LibTorch, on one process or many"};
  fastlearn::cli::LaunchArgs args;
  auto* launch = fastlearn::cli::add_launch(app, args);
  const int parsed_argc = fastlearn::cli::split_at_dashes(argc, argv, args);
  try {
    app.parse(parsed_argc, argv);
    return fastlearn::cli::run_launch(*launch, args, [](const fastlearn::LaunchOptions& options) {
      return fastlearn::detail::launch_serving(options, nullptr);  // rank 0 serves the store
    });
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const std::exception& e) {
    std::cerr << "fastlearn: error: " << e.what() << "\n";
    return 1;
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1 && std::string_view(argv[1]) == "launch") return launch_main(argc, argv);
  try {
    const auto program = helper("fastlearn-torch");
    execv(program.c_str(), argv);  // argv[0] stays this program's name: the help speaks of `fastlearn`
    std::cerr << "fastlearn: error: cannot run " << program.string() << ": " << std::strerror(errno) << "\n";
  } catch (const std::exception& e) {
    std::cerr << "fastlearn: error: " << e.what() << "\n";
  }
  return 127;
}
