#pragma once
// Internal to launch(): SIGINT/SIGTERM sent to the launcher, turned into bytes on a pipe its poll loop watches.
#include <signal.h>

#include <array>
#include <vector>

namespace fastlearn::detail {

// While alive, SIGINT and SIGTERM of the process become bytes on a pipe that the poll loop reads
// (the self-pipe trick: a handler may only do async-signal-safe things). Signals the process ignores
// (a background job's SIGINT) stay ignored. One at a time per process (the handler writes to one global pipe).
class SignalCatcher {
 public:
  SignalCatcher();
  ~SignalCatcher();
  SignalCatcher(const SignalCatcher&) = delete;
  SignalCatcher& operator=(const SignalCatcher&) = delete;

  /// The read end of the pipe, to poll for POLLIN.
  int fd() const { return fds_[0]; }

  /// Signals received since the last call, in order.
  std::vector<int> take();

 private:
  static constexpr std::array<int, 2> kSignals{SIGINT, SIGTERM};
  std::array<int, 2> fds_{-1, -1};
  std::array<struct sigaction, 2> previous_{};
};

}  // namespace fastlearn::detail
