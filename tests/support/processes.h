#pragma once
// Runs several commands at once, each with its own environment changes, and waits for all of them
// (killing every one of them at the timeout): for tests that start a job the way a scheduler would.
#include <chrono>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace fastlearn::testing {

struct Command {
  std::vector<std::string> argv;           ///< argv[0] is a path (no PATH lookup)
  std::map<std::string, std::string> env;  ///< set in the child (on top of the cleaned environment)
  std::filesystem::path log;               ///< the child's stdout and stderr go here
};

struct CommandResult {
  int exit_code = -1;  ///< -1 when a signal ended it
  int signal = 0;
  bool timed_out = false;
  std::string output;  ///< what it wrote to its log
  bool ok() const { return exit_code == 0 && !timed_out; }
};

/// Starts every command, each in a process group of its own, with the parent's environment minus every
/// variable that describes a distributed job (RANK, WORLD_SIZE, LOCAL_*, MASTER_*, GROUP_RANK,
/// TORCHELASTIC_*, OMPI_*, PMI_*, MPI_LOCAL*, SLURM_*), plus the command's own; waits for all of them.
/// At the timeout, every group still running is killed (SIGKILL) and marked timed_out.
std::vector<CommandResult> run_commands(const std::vector<Command>& commands, std::chrono::seconds timeout);

/// Runs `command` through the shell and waits for it: its exit code (-1 when a signal ended it, or it
/// could not start) and what it wrote to stdout and stderr, interleaved.
std::pair<int, std::string> run_shell(const std::string& command);

/// This build's `fastlearn` command line with `args` (shell words), through run_shell: exit_code and output.
CommandResult run_cli(const std::string& args);

}  // namespace fastlearn::testing
