#include <fastlearn/launch/detail/tcp_listen.h>

#include <fmt/format.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <memory>
#include <random>
#include <stdexcept>

namespace fastlearn::detail {
namespace {

using AddrInfo = std::unique_ptr<addrinfo, decltype(&freeaddrinfo)>;

AddrInfo resolve(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const auto service = std::to_string(port);
  if (const int rc = getaddrinfo(host.c_str(), service.c_str(), &hints, &found); rc != 0)
    throw std::runtime_error(fmt::format("cannot resolve '{}': {}", host, gai_strerror(rc)));
  return {found, &freeaddrinfo};
}

int port_of(int fd) {
  sockaddr_storage bound{};
  socklen_t length = sizeof bound;
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &length) != 0) return 0;
  if (bound.ss_family == AF_INET) return ntohs(reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  if (bound.ss_family == AF_INET6) return ntohs(reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port);
  return 0;
}

// Binds (and with `listen_too` listens on) the first address of `host` that takes `port`; -1 and `error` otherwise.
int bind_first(const AddrInfo& addresses, bool reuse_addr, bool listen_too, std::string& error) {
  for (const addrinfo* a = addresses.get(); a; a = a->ai_next) {
    const int fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) {
      error = std::strerror(errno);
      continue;
    }
    const int one = 1;
    if (reuse_addr) setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(fd, a->ai_addr, a->ai_addrlen) == 0 && (!listen_too || listen(fd, 1024) == 0)) return fd;
    error = std::strerror(errno);
    close(fd);
  }
  return -1;
}

// The first port of the kernel's ephemeral range (32768 when it cannot be read).
int ephemeral_range_start() {
  std::ifstream in("/proc/sys/net/ipv4/ip_local_port_range");
  int low = 0;
  return in >> low && low > 1024 ? low : 32768;
}

}  // namespace

ListeningSocket listen_tcp(const std::string& host, int port) {
  const auto addresses = resolve(host, port);
  std::string error = "no address";
  const int fd = bind_first(addresses, /*reuse_addr=*/true, /*listen_too=*/true, error);
  if (fd < 0) throw std::runtime_error(error);
  return {fd, port_of(fd)};
}

int free_port_for_later(const std::string& host) {
  std::string error = "no address";
  const int top = ephemeral_range_start() - 1;
  const int bottom = std::max(10000, top - 16383);
  if (bottom < top) {
    std::random_device entropy;
    std::uniform_int_distribution<int> pick(bottom, top);
    for (int attempt = 0; attempt < 64; ++attempt) {
      const int port = pick(entropy);
      // No SO_REUSEADDR: a port with a connection still in TIME_WAIT is not taken.
      const int fd = bind_first(resolve(host, port), /*reuse_addr=*/false, /*listen_too=*/false, error);
      if (fd >= 0) {
        close(fd);
        return port;
      }
    }
  }
  const int fd = bind_first(resolve(host, 0), /*reuse_addr=*/false, /*listen_too=*/false, error);
  if (fd < 0) throw std::runtime_error(error);
  const int port = port_of(fd);
  close(fd);
  return port;
}

}  // namespace fastlearn::detail
