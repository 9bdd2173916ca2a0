#pragma once
// Internal to launch(): the rendezvous store the launcher serves itself when it picks the port (one node). The
// launcher listens on the port from the moment it is chosen until the launch ends, so no other process can take it
// before rank 0 would have listened (the race of "pick a free port, release it, let rank 0 bind it"), and the store
// outlives a rank that dies, across restarts. Ranks are its clients, told so as torchrun's agent tells them:
// TORCHELASTIC_USE_AGENT_STORE=True, keys under /worker/attempt_<restart>.
//
// The store starts after the ranks: they take seconds to load LibTorch, and a rank that connects earlier waits in
// the socket's backlog. serve_store_here runs it in this process (LibTorch's TCPStore); the `fastlearn` command,
// which does not load LibTorch, runs it in a child process (distributed/store_process.h).
// This header needs no LibTorch.
#include <fastlearn/distributed/launcher.h>
#include <fastlearn/distributed/tcp_listen.h>

#include <functional>
#include <memory>
#include <string>

namespace fastlearn::detail {

/// A store that serves while this object lives.
class StoreServer {
 public:
  virtual ~StoreServer() = default;
};

/// Starts the store on `socket` (already listening on `addr`), which it takes over (and closes on failure).
/// Throws DistributedError when the store cannot start.
using ServeStore = std::function<std::unique_ptr<StoreServer>(const std::string& addr, ListeningSocket socket)>;

/// The store in this process, on LibTorch's TCPStore (defined with launch() in launch_store.cpp).
std::unique_ptr<StoreServer> serve_store_here(const std::string& addr, ListeningSocket socket);

/// launch() with the launcher's own store served by `serve` (used only when master_port is 0).
LaunchResult launch_serving(const LaunchOptions& options, const ServeStore& serve);

}  // namespace fastlearn::detail
