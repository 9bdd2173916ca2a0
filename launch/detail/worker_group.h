#pragma once
// Internal to launch(): WorkerGroup, one attempt's local ranks: started together, watched, stopped all or nothing.
#include <fastlearn/launch/detail/launch_signals.h>
#include <fastlearn/launch/detail/worker_process.h>
#include <fastlearn/launch/launcher.h>
#include <sys/types.h>

#include <filesystem>
#include <optional>
#include <vector>

namespace fastlearn::detail {

// How one attempt (one start of the group) ended.
struct Attempt {
  std::optional<RankExit> first_failure;
  int forwarded_signal = 0;             // a SIGINT/SIGTERM the launcher received and passed on
  bool forwarded_first = false;         // ... before any rank failed
  std::vector<int> killed_after_grace;  // ranks still alive when the grace period ended
};

// The local ranks of one attempt, all in one process group (led by local rank 0) and their output tailed to `out`
// and `err`. Leaving by an exception kills and reaps them all.
class WorkerGroup {
 public:
  /// Starts nproc_per_node ranks of `program` (attempt number `restart`, the master on `port`; `launcher_store`:
  /// the launcher serves the store there and every rank is its client; `rank0_store_fd` >= 0: rank 0 inherits that
  /// listening socket as kRankZeroStoreFd and serves the store on it).
  WorkerGroup(const LaunchOptions& o, SignalCatcher& signals, const std::filesystem::path& program, int restart,
              int port, bool launcher_store, int rank0_store_fd = -1);
  ~WorkerGroup();
  WorkerGroup(const WorkerGroup&) = delete;
  WorkerGroup& operator=(const WorkerGroup&) = delete;

  /// Runs the poll loop until every rank has ended: a failure or a signal stops the others (SIGTERM, then
  /// SIGKILL after the grace period).
  Attempt wait();

 private:
  void kill_all(int sig);
  void reap_and_close();

  const LaunchOptions& o_;
  SignalCatcher& signals_;
  std::vector<RankProcess> ranks_;
  pid_t pgid_ = 0;
  int devnull_ = -1;
};

}  // namespace fastlearn::detail
