#pragma once
// Rendezvous: the key-value store through which the ranks of a job find each other, made from an init
// method: "env://" (the master address and port of the resolved environment), "tcp://host:port", or
// "file:///shared/path" (a file every rank can reach; use a fresh path per job). Rank 0 serves the TCP
// store, bound only to the master address (the c10d store has no authentication), never to every
// interface unless the master address says so (0.0.0.0).
#include <fastlearn/comm/env.h>

#include <c10/util/intrusive_ptr.h>

#include <chrono>
#include <string>

namespace c10d {
class Store;
}

namespace fastlearn {

struct InitMethod {
  enum class Kind { env, tcp, file } kind = Kind::env;
  std::string host;  ///< tcp
  int port = 0;      ///< tcp
  std::string path;  ///< file
};

/// Parses an init method; ConfigError naming the accepted forms otherwise.
InitMethod parse_init_method(const std::string& text);

/// When a rank that waits for others should say so: first after `first` (0: never), then at twice the previous
/// interval, up to 5 minutes, so that a long wait is neither silent nor a flood.
class WaitingNotices {
 public:
  explicit WaitingNotices(std::chrono::milliseconds first);
  /// True when a notice is due now; the next one is then due a doubled interval later.
  bool due();
  /// Whole seconds since this wait began.
  long long seconds_waited() const;
  /// The longest a blocking call may wait before the next notice is due (`cap` when notices are off).
  std::chrono::milliseconds until_next(std::chrono::milliseconds cap) const;

 private:
  std::chrono::steady_clock::time_point start_, next_;
  std::chrono::milliseconds interval_;
};

/// Connects this rank to the job's store (rank 0 serves it for env:// and tcp://); waits up to `timeout`
/// for the server, saying on stderr that it waits as `notice_after` says (WaitingNotices). DistributedError
/// naming the address on failure (port in use, nobody listening, ...).
c10::intrusive_ptr<c10d::Store> rendezvous(const DistEnv& env, const InitMethod& method,
                                           std::chrono::milliseconds timeout,
                                           std::chrono::milliseconds notice_after = std::chrono::milliseconds(0));

}  // namespace fastlearn
