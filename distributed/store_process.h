#pragma once
// Internal to `fastlearn launch`: the launcher's rendezvous store in a child process, the program fastlearn-store,
// so that the `fastlearn` command itself never loads LibTorch and starts the ranks at once (a process that loads
// LibTorch spends a second or two in its start-up before main). The child serves on the launcher's listening
// socket, says when it serves, ignores SIGINT, SIGTERM and SIGHUP (the launcher forwards those to the ranks, which
// may still need the store to stop cleanly), and ends when the launcher closes its lifeline pipe or dies.
// No LibTorch here.
#include <fastlearn/distributed/launch_store.h>

#include <filesystem>

namespace fastlearn::detail {

/// The store served by `program` (fastlearn-store) in a child process, once it says it serves; a child that ends
/// or stays silent for `start_timeout` first is a DistributedError (its own message went to stderr).
std::unique_ptr<StoreServer> serve_store_in_child(const std::filesystem::path& program, const std::string& addr,
                                                  ListeningSocket socket,
                                                  std::chrono::milliseconds start_timeout = std::chrono::minutes(2));

/// The child's side, for fastlearn-store's main: the descriptors it was given on its command line.
struct StoreChildFds {
  int listen = -1;    ///< the listening socket
  int ready = -1;     ///< write "ready\n" here once serving, then close it
  int lifeline = -1;  ///< read end: end of file means the launcher is gone
};

/// fastlearn-store's arguments: --addr A --port P --listen-fd N --ready-fd N --lifeline-fd N. Throws ConfigError.
StoreChildFds parse_store_child_args(int argc, char** argv, std::string& addr, int& port);

}  // namespace fastlearn::detail
