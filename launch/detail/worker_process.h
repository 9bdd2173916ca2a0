#pragma once
// Internal to launch(): one rank's process — its environment, its fork()/execve() into the group, its exit status.
#include <fastlearn/launch/detail/prefixed_output.h>
#include <fastlearn/launch/launcher.h>
#include <sys/types.h>

#include <array>
#include <cstdio>
#include <string>
#include <vector>

namespace fastlearn::detail {

// A rank's process and the launcher's ends of its output.
struct RankProcess {
  RankExit exit;
  std::string log_path;                   // of `log`, for the message when writing it fails
  int pidfd = -1;                         // -1 before Linux 5.3: its exit is then polled
  std::array<PrefixedStream, 2> streams;  // stdout, stderr
  std::FILE* log = nullptr;               // <log_dir>/rank<R>.log, when there is a log_dir
  bool exited = false;                    // its exit status is known (it may not be reaped yet)
  bool reaped = false;
  bool stop_reported = false;  // the launcher said that it is stopped (SIGSTOP, SIGTSTP), and not yet that it goes on
  std::string prefix;
};

/// True when the rank's process is stopped by a signal (SIGSTOP, SIGTSTP, ...): state T in /proc/<pid>/stat.
bool is_stopped(const RankProcess& rank);

// Everything a child needs, prepared before fork(): between fork() and execve() only async-signal-safe calls.
struct ExecPlan {
  std::string path;
  std::vector<std::string> args;
  std::vector<std::string> env;
  std::vector<char*> argv;
  std::vector<char*> envp;
  int fd_limit = 0;     ///< descriptors run below this (RLIMIT_NOFILE), for mark_cloexec_from
  int inherit_fd = -1;  ///< a descriptor the program gets as kRankZeroStoreFd (the launcher's listening socket)
  /// Fills argv and envp from args and env; call once, after they are final.
  void seal();
};

/// Sets FD_CLOEXEC on every descriptor from `first` up to `limit`, one fcntl() each (async-signal-safe): what
/// close_range(CLOSE_RANGE_CLOEXEC) does in one call from Linux 5.11 on, for older kernels.
void mark_cloexec_from(int first, int limit);

/// The environment of local rank `local_rank`: the launcher's own, with torchrun's variables (and extra_env) set.
/// `launcher_store`: the launcher serves the store on `port` (TORCHELASTIC_USE_AGENT_STORE=True). `live`: `out` is
/// a terminal, so rank 0 gets FASTLEARN_PROGRESS_LIVE=1.
std::vector<std::string> rank_environment(const LaunchOptions& o, int local_rank, int restart, int port,
                                          bool launcher_store, bool live);

/// Forks and execs `plan` for `r` in process group `group` (0: a new group led by the new process), with
/// `stdin_fd` as its stdin and pipes as its stdout and stderr. Sets r.exit.pid, r.pidfd and the streams' fds;
/// throws DistributedError when the pipes or fork() fail.
void start_rank(RankProcess& r, const ExecPlan& plan, pid_t group, int stdin_fd);

/// In a child after fork(), when execve() of `program` failed: says so on stderr ("fastlearn launch: execve() of
/// <what> '<program>' failed: <reason>") with async-signal-safe calls only, and exits with 127.
[[noreturn]] void exit_after_failed_exec(const char* what, const char* program);

/// Records the rank's exit if it has ended, leaving it a zombie: its pid (and with rank 0 the group's id)
/// stays reserved until the final reap, so signals to the group can never reach a recycled id.
bool check_exit(RankProcess& rank);

}  // namespace fastlearn::detail
