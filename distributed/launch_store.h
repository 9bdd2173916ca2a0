#pragma once
// Internal to launch(): the rendezvous store the launcher serves itself when it picks the port (one node). It
// holds the port from the moment it is chosen until the launch ends, so no other process can take it before rank 0
// would have listened (the race of "pick a free port, release it, let rank 0 bind it"), and it outlives a rank that
// dies, across restarts. Ranks are its clients, told so as torchrun's agent tells them:
// TORCHELASTIC_USE_AGENT_STORE=True, keys under /worker/attempt_<restart>.
#include <memory>
#include <string>

namespace fastlearn::detail {

class LaunchStore {
 public:
  /// Serves a TCP store on a free port of `addr` (bound to that address only). ConfigError when `addr` is not an
  /// address of this machine.
  explicit LaunchStore(const std::string& addr);
  ~LaunchStore();
  LaunchStore(const LaunchStore&) = delete;
  LaunchStore& operator=(const LaunchStore&) = delete;

  int port() const { return port_; }

 private:
  struct Server;
  std::unique_ptr<Server> server_;
  int port_ = 0;
};

}  // namespace fastlearn::detail
