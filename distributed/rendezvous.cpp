#include <fastlearn/distributed/rendezvous.h>

#include <fastlearn/core/error.h>

#include <fmt/format.h>
#include <netdb.h>
#include <sys/socket.h>
#include <torch/csrc/distributed/c10d/FileStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <charconv>
#include <cstring>

namespace fastlearn {

InitMethod parse_init_method(const std::string& text) {
  auto bad = [&] {
    return ConfigError(fmt::format("init method '{}' is not one of env://, tcp://HOST:PORT, file:///PATH", text));
  };
  InitMethod method;
  if (text == "env://" || text.empty()) return method;
  if (text.starts_with("tcp://")) {
    const auto rest = text.substr(6);
    const auto colon = rest.rfind(':');
    if (colon == std::string::npos || colon == 0) throw bad();
    method.kind = InitMethod::Kind::tcp;
    method.host = rest.substr(0, colon);
    if (method.host.size() > 2 && method.host.front() == '[' && method.host.back() == ']') {
      method.host = method.host.substr(1, method.host.size() - 2);  // [IPv6]
    }
    const auto port = rest.substr(colon + 1);
    auto [ptr, ec] = std::from_chars(port.data(), port.data() + port.size(), method.port);
    if (ec != std::errc() || ptr != port.data() + port.size() || method.port < 1 || method.port > 65535) throw bad();
    return method;
  }
  if (text.starts_with("file://")) {
    method.kind = InitMethod::Kind::file;
    method.path = text.substr(7);
    if (method.path.empty() || method.path.front() != '/') throw bad();
    return method;
  }
  throw bad();
}

namespace {

// A listening socket bound to host:port only, handed to the TCP store server.
int listen_on(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const auto service = std::to_string(port);
  if (int rc = getaddrinfo(host.c_str(), service.c_str(), &hints, &found); rc != 0) {
    throw DistributedError(fmt::format("cannot resolve the master address '{}': {}", host, gai_strerror(rc)));
  }
  std::string last_error = "no address";
  for (auto* ai = found; ai; ai = ai->ai_next) {
    const int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
    if (fd < 0) continue;
    const int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(fd, ai->ai_addr, ai->ai_addrlen) == 0 && listen(fd, 1024) == 0) {
      freeaddrinfo(found);
      return fd;
    }
    last_error = std::strerror(errno);
    close(fd);
  }
  freeaddrinfo(found);
  throw DistributedError(fmt::format("rank 0 cannot listen on {}:{} for the rendezvous: {}; pick a free MASTER_PORT "
                                     "(or --master-port) and a MASTER_ADDR of this host", host, port, last_error));
}

}  // namespace

c10::intrusive_ptr<c10d::Store> rendezvous(const DistEnv& env, const InitMethod& method,
                                           std::chrono::milliseconds timeout) {
  if (method.kind == InitMethod::Kind::file) {
    try {
      return c10::make_intrusive<c10d::FileStore>(method.path, env.world_size);
    } catch (const std::exception& e) {
      throw DistributedError(fmt::format("rank {}: cannot use the file store '{}': {}", env.rank, method.path, e.what()));
    }
  }
  const std::string host = method.kind == InitMethod::Kind::tcp ? method.host : env.master_addr;
  const int port = method.kind == InitMethod::Kind::tcp ? method.port : env.master_port;
  // Under torchrun the elastic agent already serves the store on the master port; every rank is a
  // client, and keys live under the restart attempt's prefix (as torch's env:// rendezvous does).
  const char* agent_store = std::getenv("TORCHELASTIC_USE_AGENT_STORE");
  const bool use_agent_store = method.kind == InitMethod::Kind::env && agent_store && std::string(agent_store) == "True";
  c10d::TCPStoreOptions options;
  options.port = static_cast<std::uint16_t>(port);
  options.isServer = env.rank == 0 && !use_agent_store;
  options.numWorkers = static_cast<std::size_t>(env.world_size);
  options.waitWorkers = false;  // the backend's own rendezvous waits for every rank
  options.timeout = timeout;
  if (options.isServer) options.masterListenFd = listen_on(host, port);
  try {
    c10::intrusive_ptr<c10d::Store> store = c10::make_intrusive<c10d::TCPStore>(host, options);
    if (use_agent_store) {
      const char* attempt = std::getenv("TORCHELASTIC_RESTART_COUNT");
      store = c10::make_intrusive<c10d::PrefixStore>(fmt::format("/worker/attempt_{}", attempt ? attempt : "0"), store);
    }
    return store;
  } catch (const std::exception& e) {
    if (options.masterListenFd) close(*options.masterListenFd);
    throw DistributedError(fmt::format("rank {} of {}: rendezvous with the store at {}:{} failed within {} ms: {}",
                                       env.rank, env.world_size, host, port, timeout.count(), e.what()));
  }
}

}  // namespace fastlearn
