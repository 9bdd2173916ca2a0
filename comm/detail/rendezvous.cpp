#include <fastlearn/comm/detail/rendezvous.h>

#include <fastlearn/comm/process_group.h>
#include <fastlearn/core/detail/text.h>
#include <fastlearn/core/error.h>
#include <fastlearn/launch/detail/tcp_listen.h>

#include <arpa/inet.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>
#include <torch/csrc/distributed/c10d/FileStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <charconv>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <optional>
#include <thread>

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
  try {
    return detail::listen_tcp(host, port).fd;
  } catch (const std::exception& e) {
    throw DistributedError(
        fmt::format("rank 0 cannot listen on {}:{} for the rendezvous: {}; pick a free MASTER_PORT "
                    "(or --master-port) and a MASTER_ADDR of this host",
                    host, port, e.what()));
  }
}

// Rank 0 of `fastlearn launch` inherits the launcher's listening socket (FASTLEARN_STORE_FD; see launch_store.h):
// the port is the launcher's, so rank 0 serves on that socket instead of binding the port. Each setup serves on a
// duplicate, which the store closes, so a program may set up again.
std::optional<int> inherited_store_socket(int port) {
  const char* text = std::getenv("FASTLEARN_STORE_FD");
  if (!text || !*text) return std::nullopt;
  int fd = -1;
  const std::string_view digits(text);
  const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), fd);
  sockaddr_storage address{};
  socklen_t length = sizeof address;
  int listening = 0;
  socklen_t size = sizeof listening;
  const bool ok = ec == std::errc() && end == digits.data() + digits.size() && fd >= 0 &&
                  getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) == 0 &&
                  getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &size) == 0 && listening != 0 &&
                  (address.ss_family == AF_INET || address.ss_family == AF_INET6) &&
                  ntohs(address.ss_family == AF_INET ? reinterpret_cast<sockaddr_in&>(address).sin_port
                                                     : reinterpret_cast<sockaddr_in6&>(address).sin6_port) == port;
  if (!ok)
    throw DistributedError(fmt::format(
        "FASTLEARN_STORE_FD={} is not a socket listening on MASTER_PORT {}: `fastlearn launch` sets it for its rank "
        "0 alone; unset it",
        excerpt(text), port));
  const int copy = fcntl(fd, F_DUPFD_CLOEXEC, 0);
  if (copy < 0)
    throw DistributedError(fmt::format("rank 0 cannot use the launcher's store socket: {}", std::strerror(errno)));
  return copy;
}

// How many setups this process made before this one (every rank makes the same number).
int next_setup() {
  static std::atomic<int> setups{0};
  return setups++;
}

// Which run this setup belongs to: the launcher's FASTLEARN_RUN_ID (<launch id>.<restart>) or a scheduler's
// job id, plus the setup's number, so that two setups back to back on one port never share a store.
std::string run_key(int generation) {
  std::string run;
  if (const char* ours = std::getenv("FASTLEARN_RUN_ID"); ours && *ours) {
    run = ours;
  } else if (const char* slurm = std::getenv("SLURM_JOB_ID"); slurm && *slurm) {
    const char* step = std::getenv("SLURM_STEP_ID");
    run = fmt::format("slurm-{}.{}", slurm, step ? step : "");
  } else if (const char* ompi = std::getenv("OMPI_MCA_ess_base_jobid"); ompi && *ompi) {
    run = fmt::format("ompi-{}", ompi);
  }
  return fmt::format("{}#{}", run, generation);
}

constexpr const char* kRunKeyName = "fastlearn/run_key";

std::string text_of(const std::vector<std::uint8_t>& bytes) { return {bytes.begin(), bytes.end()}; }

}  // namespace

WaitingNotices::WaitingNotices(std::chrono::milliseconds first)
    : start_(std::chrono::steady_clock::now()), next_(start_ + first), interval_(first) {}

bool WaitingNotices::due() {
  const auto now = std::chrono::steady_clock::now();
  if (interval_.count() <= 0 || now < next_) return false;
  interval_ = std::min<std::chrono::milliseconds>(2 * interval_, std::chrono::minutes(5));
  next_ = now + interval_;
  return true;
}

long long WaitingNotices::seconds_waited() const {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::steady_clock::now() - start_).count();
}

std::chrono::milliseconds WaitingNotices::until_next(std::chrono::milliseconds cap) const {
  if (interval_.count() <= 0) return cap;
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(next_ - std::chrono::steady_clock::now());
  return std::clamp(left, std::chrono::milliseconds(100), cap);
}

c10::intrusive_ptr<c10d::Store> rendezvous(const DistEnv& env, const InitMethod& method,
                                           std::chrono::milliseconds timeout, std::chrono::milliseconds notice_after) {
  if (method.kind == InitMethod::Kind::file) {
    try {
      return c10::make_intrusive<c10d::FileStore>(method.path, env.world_size);
    } catch (const std::exception& e) {
      throw DistributedError(
          fmt::format("rank {}: cannot use the file store '{}': {}", env.rank, method.path, error_text(e)));
    }
  }
  const std::string host = method.kind == InitMethod::Kind::tcp ? method.host : env.master_addr;
  const int port = method.kind == InitMethod::Kind::tcp ? method.port : env.master_port;
  // Under torchrun the elastic agent already serves the store on the master port; every rank is a
  // client, and keys live under the restart attempt's prefix (as torch's env:// rendezvous does).
  const char* agent_store = std::getenv("TORCHELASTIC_USE_AGENT_STORE");
  const bool use_agent_store =
      method.kind == InitMethod::Kind::env && agent_store && std::string(agent_store) == "True";
  c10d::TCPStoreOptions options;
  options.port = static_cast<std::uint16_t>(port);
  options.isServer = env.rank == 0 && !use_agent_store;
  options.numWorkers = static_cast<std::size_t>(env.world_size);
  options.waitWorkers = false;  // the backend's own rendezvous waits for every rank
  options.timeout = timeout;
  if (options.isServer) {
    const auto inherited = method.kind == InitMethod::Kind::env ? inherited_store_socket(port) : std::nullopt;
    options.masterListenFd = inherited ? *inherited : listen_on(host, port);
  }
  const int generation = next_setup();
  const auto key = run_key(generation);
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  auto remaining = [&] {
    return std::max(std::chrono::milliseconds(1),
                    std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now()));
  };
  const std::string where = method.kind == InitMethod::Kind::tcp
                                ? fmt::format("the init method tcp://{}:{}", host, port)
                                : fmt::format("MASTER_ADDR={} MASTER_PORT={}", host, port);
  auto failed = [&](const std::string& why) {
    return DistributedError(
        fmt::format("rank {} of {}: rendezvous with the store at {}:{} failed within {} ms: {}. "
                    "Check that rank 0 runs and that {} reaches it from this host",
                    env.rank, env.world_size, host, port, timeout.count(), why, where));
  };
  if (options.isServer || use_agent_store) {
    c10::intrusive_ptr<c10d::Store> store;
    try {
      store = c10::make_intrusive<c10d::TCPStore>(host, options);
      if (use_agent_store) {
        // The agent's store (torchrun's, or our launcher's) lives across restarts: the attempt's prefix separates
        // them, and the setup's number the setups of one attempt.
        const char* attempt = std::getenv("TORCHELASTIC_RESTART_COUNT");
        const auto prefix = fmt::format("/worker/attempt_{}", attempt ? attempt : "0");
        return c10::make_intrusive<c10d::PrefixStore>(
            generation == 0 ? prefix : fmt::format("{}/setup_{}", prefix, generation), store);
      }
      store->set(kRunKeyName, std::vector<std::uint8_t>(key.begin(), key.end()));
    } catch (const std::exception& e) {
      if (options.masterListenFd && !store) close(*options.masterListenFd);
      throw failed(error_text(e));
    }
    return c10::make_intrusive<c10d::PrefixStore>(key + "/", store);
  }
  // A client checks whose store it reached: a store still served by a previous run on this port (its rank 0
  // not gone yet) is left alone, and this rank tries again until its own run's store is up.
  std::string foreign, last_error;
  WaitingNotices notices(notice_after);
  while (std::chrono::steady_clock::now() < deadline) {
    if (notices.due()) {
      std::cerr << fmt::format(
                       "fastlearn: rank {} of {} waits for the rendezvous store at {}:{}, which rank 0 serves: no "
                       "answer after {} s (the timeout is {} s). Check that rank 0 runs and that {} reaches it\n",
                       env.rank, env.world_size, host, port, notices.seconds_waited(),
                       std::chrono::duration_cast<std::chrono::seconds>(timeout).count(), where)
                << std::flush;
    }
    try {
      options.timeout = notices.until_next(remaining());  // back in time for the next notice
      auto store = c10::make_intrusive<c10d::TCPStore>(host, options);
      while (std::chrono::steady_clock::now() < deadline) {
        if (store->check({kRunKeyName})) {
          const auto theirs = text_of(store->get(kRunKeyName));
          if (theirs == key) {
            store->setTimeout(timeout);
            return c10::make_intrusive<c10d::PrefixStore>(key + "/", store);
          }
          foreign = theirs;
          break;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
    } catch (const std::exception& e) {
      last_error = error_text(e);  // e.g. the other run's store went away while we asked it: try again
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  if (foreign.empty()) throw failed(last_error.empty() ? "its store never said which run it serves" : last_error);
  throw DistributedError(fmt::format(
      "rank {} of {}: the store at {}:{} serves another run ('{}') and not this rank's ('{}') within {} ms. Another "
      "job (or an earlier run still ending) uses MASTER_PORT {}: give each job its own port, and every rank of a job "
      "the same launch",
      env.rank, env.world_size, host, port, foreign, key, timeout.count(), port));
}

}  // namespace fastlearn
