#pragma once
// Internal to launch(): the rendezvous store the launcher serves itself when it picks the port (one node). The
// launcher listens on the port from the moment it is chosen until the launch ends, so no other process can take it
// before rank 0 would have listened (the race of "pick a free port, release it, let rank 0 bind it"), and the store
// outlives a rank that dies, across restarts. Ranks are its clients, told so as torchrun's agent tells them:
// TORCHELASTIC_USE_AGENT_STORE=True, keys under /worker/attempt_<restart>.
//
// The store starts after the ranks: they take seconds to load LibTorch, and a rank that connects earlier waits in
// the socket's backlog. serve_store_here runs it in this process (LibTorch's TCPStore); the `fastlearn` command,
// which does not load LibTorch, hands the socket to rank 0 instead (see launch_serving).
// This header needs no LibTorch.
#include <fastlearn/launch/detail/tcp_listen.h>
#include <fastlearn/launch/launcher.h>

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

/// launch() with the launcher's own store served by `serve` (used only when master_port is 0). Without `serve` (the
/// `fastlearn` command, which loads no LibTorch) rank 0 serves the store on the launcher's listening socket, which it
/// inherits as descriptor kRankZeroStoreFd (FASTLEARN_STORE_FD names it): no process beside the ranks loads LibTorch
/// while they do, which would cost them a tenth of a second on 2 cores (bench launch_to_first_batch). The launcher
/// keeps the socket for the whole launch: every restart's rank 0 serves on it, and ranks that connect before it does
/// wait in its backlog.
LaunchResult launch_serving(const LaunchOptions& options, const ServeStore& serve);

/// The descriptor number under which rank 0 inherits the launcher's listening socket.
inline constexpr int kRankZeroStoreFd = 3;

}  // namespace fastlearn::detail
