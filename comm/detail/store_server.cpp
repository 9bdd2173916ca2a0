#include <fastlearn/launch/detail/launch_serving.h>

#include <fastlearn/core/error.h>
#include <fmt/format.h>
#include <unistd.h>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

namespace fastlearn {

namespace detail {

namespace {

struct TcpStoreServer : StoreServer {
  c10::intrusive_ptr<c10d::TCPStore> store;
};

}  // namespace

std::unique_ptr<StoreServer> serve_store_here(const std::string& addr, ListeningSocket socket) {
  c10d::TCPStoreOptions options;
  options.port = static_cast<std::uint16_t>(socket.port);
  options.isServer = true;
  options.waitWorkers = false;
  options.masterListenFd = socket.fd;  // the store owns it from here
  auto server = std::make_unique<TcpStoreServer>();
  try {
    server->store = c10::make_intrusive<c10d::TCPStore>(addr, options);
  } catch (const std::exception& e) {
    close(socket.fd);
    const auto* c10_error = dynamic_cast<const c10::Error*>(&e);
    throw DistributedError(fmt::format("launch: cannot start the rendezvous store on {}:{}: {}", addr, socket.port,
                                       c10_error ? c10_error->what_without_backtrace() : e.what()));
  }
  return server;
}

}  // namespace detail

LaunchResult launch(const LaunchOptions& options) { return detail::launch_serving(options, detail::serve_store_here); }

}  // namespace fastlearn
