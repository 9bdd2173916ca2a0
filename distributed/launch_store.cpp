#include <fastlearn/distributed/launch_store.h>

#include <fastlearn/core/error.h>
#include <fastlearn/distributed/process_group.h>
#include <fastlearn/distributed/tcp_listen.h>
#include <fmt/format.h>
#include <unistd.h>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

namespace fastlearn::detail {

struct LaunchStore::Server {
  c10::intrusive_ptr<c10d::TCPStore> store;
};

LaunchStore::LaunchStore(const std::string& addr) : server_(std::make_unique<Server>()) {
  ListeningSocket socket;
  try {
    socket = listen_tcp(addr, 0);
  } catch (const std::exception& e) {
    throw ConfigError(
        fmt::format("launch: cannot serve the rendezvous store on master_addr '{}' ({}); use an "
                    "address of this machine or pass master_port",
                    addr, e.what()));
  }
  c10d::TCPStoreOptions options;
  options.port = static_cast<std::uint16_t>(socket.port);
  options.isServer = true;
  options.waitWorkers = false;
  options.masterListenFd = socket.fd;  // the store owns it from here
  try {
    server_->store = c10::make_intrusive<c10d::TCPStore>(addr, options);
  } catch (const std::exception& e) {
    close(socket.fd);
    throw DistributedError(
        fmt::format("launch: cannot start the rendezvous store on {}:{}: {}", addr, socket.port, error_text(e)));
  }
  port_ = socket.port;
}

LaunchStore::~LaunchStore() = default;

}  // namespace fastlearn::detail
