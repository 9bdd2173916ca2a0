#include <fastlearn/distributed/launcher.h>

#include <fastlearn/core/error.h>
#include <fastlearn/distributed/launch_options.h>
#include <fastlearn/distributed/launch_signals.h>
#include <fastlearn/distributed/worker_group.h>
#include <fmt/format.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <memory>
#include <random>
#include <string_view>

namespace fastlearn {
namespace fs = std::filesystem;

namespace {

// launch() uses process-wide state (the signal handlers and their pipe): one call at a time.
std::atomic<bool> g_launch_running{false};

int exit_code_of(const RankExit& e) { return e.signal != 0 ? 128 + e.signal : e.exit_code; }

std::string plural(int n, std::string_view word) { return fmt::format("{} {}{}", n, word, n == 1 ? "" : "s"); }

}  // namespace

std::string signal_name(int signal) {
  if (const char* abbrev = sigabbrev_np(signal)) return fmt::format("SIG{}", abbrev);
  return fmt::format("signal {}", signal);
}

std::string RankExit::describe() const {
  if (signal != 0)
    return fmt::format("rank {} (local {}, pid {}) was killed by signal {} ({})", rank, local_rank, pid, signal,
                       signal_name(signal));
  return fmt::format("rank {} (local {}, pid {}) exited with code {}", rank, local_rank, pid, exit_code);
}

int pick_free_port(const std::string& addr) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* found = nullptr;
  if (const int rc = getaddrinfo(addr.c_str(), "0", &hints, &found); rc != 0)
    throw ConfigError(fmt::format("launch: cannot resolve master_addr '{}': {}; pass an address of this machine", addr,
                                  gai_strerror(rc)));
  std::unique_ptr<addrinfo, decltype(&freeaddrinfo)> guard(found, &freeaddrinfo);
  std::string last_error = "no address";
  for (const addrinfo* a = found; a; a = a->ai_next) {
    const int fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) {
      last_error = std::strerror(errno);
      continue;
    }
    sockaddr_storage bound{};
    socklen_t length = sizeof bound;
    const bool ok =
        bind(fd, a->ai_addr, a->ai_addrlen) == 0 && getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &length) == 0;
    if (!ok) last_error = std::strerror(errno);
    close(fd);
    if (!ok) continue;
    if (bound.ss_family == AF_INET) return ntohs(reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
    if (bound.ss_family == AF_INET6) return ntohs(reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port);
  }
  throw ConfigError(
      fmt::format("launch: cannot bind a free port on master_addr '{}' ({}); use an address of this "
                  "machine or pass master_port",
                  addr, last_error));
}

LaunchResult launch(const LaunchOptions& given) {
  detail::validate_options(given);
  LaunchOptions options = given;
  if (options.run_id.empty() && options.nnodes == 1) {
    std::random_device entropy;  // one node: a fresh id per launch keeps its ranks out of any other run's store
    options.run_id = fmt::format("{:08x}{:08x}", entropy(), entropy());
  }
  const fs::path program = detail::resolve_program(options.command.front());
  if (options.log_dir) {
    std::error_code ec;
    fs::create_directories(*options.log_dir, ec);
    if (ec)
      throw ConfigError(fmt::format("launch: cannot create log_dir '{}': {}; pass a writable folder",
                                    options.log_dir->string(), ec.message()));
  }
  if (options.master_port == 0) pick_free_port(options.master_addr);  // a bad address is an option error, up front

  if (g_launch_running.exchange(true))
    throw DistributedError("launch: another launch() is running in this process; run them one after the other");
  struct Release {
    ~Release() { g_launch_running = false; }
  } release;
  detail::SignalCatcher signals;

  const int nranks = options.nproc_per_node;
  for (int restart = 0;; ++restart) {
    const int port = options.master_port != 0 ? options.master_port : pick_free_port(options.master_addr);
    detail::Attempt a;
    {
      detail::WorkerGroup group(options, signals, program, restart, port);
      a = group.wait();
    }
    LaunchResult result;
    result.restarts = restart;
    result.first_failure = a.first_failure;
    const std::string after = restart > 0 ? fmt::format(" (after {})", plural(restart, "restart")) : std::string();
    std::string killed;
    if (!a.killed_after_grace.empty()) {
      killed = "; still running after the grace period of " +
               fmt::format("{} ms, killed: rank", options.grace_period.count());
      for (std::size_t i = 0; i < a.killed_after_grace.size(); ++i)
        killed += fmt::format("{}{}", i == 0 ? " " : ", ", a.killed_after_grace[i]);
    }

    if (a.forwarded_signal && a.forwarded_first) {
      result.exit_code = 128 + a.forwarded_signal;
      result.summary = fmt::format("interrupted by {}: forwarded to all {}, now all gone{}{}",
                                   signal_name(a.forwarded_signal), plural(nranks, "rank"), killed, after);
      return result;
    }
    if (!a.first_failure) {
      result.exit_code = 0;
      result.summary = fmt::format("all {} exited with code 0{}", plural(nranks, "rank"), after);
      return result;
    }
    const RankExit& first = *a.first_failure;
    result.exit_code = exit_code_of(first);
    // A SIGINT/SIGTERM after the failure (during the stop, or just now) cancels any restart.
    int late_signal = a.forwarded_signal;
    for (int sig : signals.take())
      if (!late_signal) late_signal = sig;
    if (restart < options.max_restarts && !late_signal) {
      std::fprintf(options.err, "fastlearn launch: %s; restarting all %s (restart %d of %d)\n",
                   first.describe().c_str(), plural(nranks, "local rank").c_str(), restart + 1, options.max_restarts);
      std::fflush(options.err);
      continue;
    }
    result.summary = fmt::format("{}; the other ranks were stopped{}{}", first.describe(), killed, after);
    if (late_signal)
      result.summary += fmt::format("; then interrupted by {}, so no restart", signal_name(late_signal));
    else if (options.max_restarts > 0)
      result.summary += fmt::format("; gave up after max_restarts = {}", options.max_restarts);
    return result;
  }
}

}  // namespace fastlearn
