#pragma once
// launch(): the process launcher behind `fastlearn launch` and spawn() — torchrun's local agent, in C++.
//
// One process per local rank, all in one process group of their own, each told its place through
// torchrun's environment variables: RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK (the node
// rank), GROUP_WORLD_SIZE, MASTER_ADDR, MASTER_PORT, TORCHELASTIC_RESTART_COUNT (0 on the first attempt),
// TORCHELASTIC_MAX_RESTARTS, OMP_NUM_THREADS (only when the launcher's environment and extra_env leave it
// unset: max(1, usable cores / nproc_per_node)), and FASTLEARN_PROGRESS_LIVE=1 for rank 0 when
// `out` is a terminal. Without a master_port the launcher picks a port and holds it for the whole launch, so no other
// process can take it before the ranks meet there: launch() serves the rendezvous store on it itself, as torchrun's
// agent does (TORCHELASTIC_USE_AGENT_STORE=True, the ranks its clients); the `fastlearn` command, which loads no
// LibTorch, hands it to rank 0 to serve (launch/detail/launch_serving.h).
// A rank's stdin is /dev/null; its stdout and stderr come back through pipes and are
// written to `out` and `err` line by line, each line prefixed with "[rank R] ".
//
// All or nothing: when one rank exits non-zero or is killed by a signal, every other rank (its whole
// process group, so also the processes a rank started) gets SIGTERM, and SIGKILL after grace_period.
// SIGINT and SIGTERM sent to the launcher are forwarded the same way; one that comes while ranks are
// already being stopped (after a failure or a first signal) SIGKILLs them at once.
// Ranks die with the launcher (PR_SET_PDEATHSIG), so even a SIGKILLed launcher leaves no rank behind (the
// processes a rank started die with it only if the rank arranges it: the launcher had no chance to kill the group).
//
// Restarts (max_restarts > 0) stop and restart the whole local group after a failure, never after a
// forwarded signal. There is no cross-node coordination: with several nodes each node's launcher
// restarts only its own ranks, so the ranks on other nodes must fail too (e.g. a collective times out)
// for the job to come back; the app resumes from its last checkpoint.
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace fastlearn {

struct LaunchOptions {
  int nproc_per_node = 1;
  int nnodes = 1;
  int node_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 0;  ///< 0: the launcher serves the store on a free port of master_addr (single node only)
  int max_restarts = 0;
  std::optional<std::filesystem::path>
      log_dir;  ///< also write each rank's output to <log_dir>/rank<R>.log (and restart_<k>/ subfolders after restarts)
  std::chrono::milliseconds grace_period = std::chrono::seconds(10);  ///< SIGTERM -> SIGKILL delay
  std::vector<std::string> command;  ///< program and its arguments; a program without '/' is looked up in PATH
  std::map<std::string, std::string>
      extra_env;  ///< added to the launcher's environment (may not set the variables above)
  /// The job's id (torchrun's --rdzv-id): every node of a job must be given the same one. Each start of the
  /// ranks gets FASTLEARN_RUN_ID=<id>.<restart>, which rendezvous checks, so that no rank ever joins the store
  /// of another run on the same port. Default: random on a single node; none across nodes (then give one).
  std::string run_id;
  bool prefix_output = true;  ///< "[rank R] " before each line of a rank's stdout/stderr
  std::FILE* out = stdout;
  std::FILE* err = stderr;  ///< where the launcher writes (tests redirect)
};

/// How one rank ended (exit_code when it exited, signal when a signal killed it).
struct RankExit {
  int rank = 0;  ///< global rank
  int local_rank = 0;
  int pid = 0;
  int exit_code = -1;  ///< -1 when killed by a signal
  int signal = 0;      ///< 0 when it exited
  /// "rank 1 (local 1, pid 1234) exited with code 3" or "... was killed by signal 9 (SIGKILL)".
  std::string describe() const;
};

struct LaunchResult {
  /// 0 when the last attempt succeeded. Otherwise the first failing rank's exit code of the last attempt
  /// (128 + signal when a signal killed it); after a forwarded SIGINT/SIGTERM that came before any failure,
  /// 128 + that signal, like a shell.
  int exit_code = 0;
  std::optional<RankExit> first_failure;  ///< of the last attempt
  int restarts = 0;                       ///< how many times the group was restarted
  std::string summary;                    ///< one line: what happened, naming the first failing rank
};

/// Runs options.command on nproc_per_node local ranks until all have ended, and returns how it went.
/// Throws ConfigError on bad options (node_rank >= nnodes, nproc_per_node < 1, empty command, a program
/// that is not found or not executable, master_port 0 with several nodes, ...) before starting anything.
/// Only one call at a time may run per process. Defined by the fastlearn library (the store it serves needs LibTorch),
/// not by the LibTorch-free objects of launch/.
LaunchResult launch(const LaunchOptions& options);

/// A TCP port of `addr` free now, for a program that binds it later (torchrun, a Python rank 0): taken from
/// below the kernel's ephemeral range, so only another explicit choice can take it in between. ConfigError when
/// `addr` is not an address of this machine.
int pick_free_port(const std::string& addr);

/// "SIGKILL" for 9, "signal 64" for a number with no name.
std::string signal_name(int signal);

}  // namespace fastlearn
