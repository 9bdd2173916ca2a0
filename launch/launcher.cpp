#include <fastlearn/launch/launcher.h>

#include <fastlearn/core/error.h>
#include <fastlearn/launch/detail/launch_serving.h>
#include <fastlearn/launch/detail/launch_signals.h>
#include <fastlearn/launch/detail/option_checks.h>
#include <fastlearn/launch/detail/tcp_listen.h>
#include <fastlearn/launch/detail/worker_group.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <memory>
#include <optional>
#include <random>
#include <string_view>

namespace fastlearn {
namespace fs = std::filesystem;

namespace {

// launch() uses process-wide state (the signal handlers and their pipe): one call at a time.
std::atomic<bool> g_launch_running{false};

int exit_code_of(const RankExit& e) { return e.signal != 0 ? 128 + e.signal : e.exit_code; }

std::string plural(int n, std::string_view word) { return fmt::format("{} {}{}", n, word, n == 1 ? "" : "s"); }

// Descriptors 0, 1 and 2 open (on /dev/null where the caller closed them), so that no pipe the launcher makes takes
// one of them: a rank's pipe end there would keep its close-on-exec flag through dup2() and vanish at exec.
void open_standard_descriptors() {
  for (int fd = 0; fd <= 2; ++fd) {
    if (fcntl(fd, F_GETFD) >= 0 || errno != EBADF) continue;
    const int opened = open("/dev/null", O_RDWR);  // the lowest free descriptor: this one
    if (opened == fd) continue;
    if (opened >= 0) close(opened);
    throw DistributedError(fmt::format("launch: descriptor {} is closed and /dev/null cannot take its place", fd));
  }
}

// With SIGCHLD ignored (inherited from whoever started the launcher) the kernel reaps the ranks itself and their exit
// statuses are lost: for the launch, children are waited for as by default.
class ChildrenWaitable {
 public:
  ChildrenWaitable() {
    sigaction(SIGCHLD, nullptr, &previous_);
    if (previous_.sa_handler != SIG_IGN && !(previous_.sa_flags & SA_NOCLDWAIT)) return;
    struct sigaction dfl {};
    dfl.sa_handler = SIG_DFL;
    sigemptyset(&dfl.sa_mask);
    changed_ = sigaction(SIGCHLD, &dfl, nullptr) == 0;
  }
  ~ChildrenWaitable() {
    if (changed_) sigaction(SIGCHLD, &previous_, nullptr);
  }
  ChildrenWaitable(const ChildrenWaitable&) = delete;
  ChildrenWaitable& operator=(const ChildrenWaitable&) = delete;

 private:
  struct sigaction previous_ {};
  bool changed_ = false;
};

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
  try {
    return detail::free_port_for_later(addr);
  } catch (const std::exception& e) {
    throw ConfigError(
        fmt::format("cannot pick a free port on '{}' ({}); use an address of this machine", addr, e.what()));
  }
}

namespace detail {

LaunchResult launch_serving(const LaunchOptions& given, const ServeStore& serve) {
  validate_options(given);
  open_standard_descriptors();  // before the launcher makes any descriptor of its own
  LaunchOptions options = given;
  if (options.run_id.empty() && options.nnodes == 1) {
    std::random_device entropy;  // one node: a fresh id per launch keeps its ranks out of any other run's store
    options.run_id = fmt::format("{:08x}{:08x}", entropy(), entropy());
  }
  const fs::path program = resolve_program(options.command.front());
  if (options.log_dir) {
    std::error_code ec;
    fs::create_directories(*options.log_dir, ec);
    if (ec)
      throw ConfigError(fmt::format("launch: cannot create log_dir '{}': {}; pass a writable folder",
                                    options.log_dir->string(), ec.message()));
  }
  // No port given: the launcher serves the store itself, on a port it holds from now on (a bad address is an option
  // error, up front).
  std::optional<ListeningSocket> store_socket;
  if (options.master_port == 0) {
    try {
      store_socket = listen_tcp(options.master_addr, 0);
    } catch (const std::exception& e) {
      throw ConfigError(
          fmt::format("launch: cannot serve the rendezvous store on master_addr '{}' ({}); use an "
                      "address of this machine or pass master_port",
                      options.master_addr, e.what()));
    }
  }
  struct CloseUnserved {  // until the store takes the socket over
    std::optional<ListeningSocket>& socket;
    ~CloseUnserved() {
      if (socket) close(socket->fd);
    }
  } close_unserved{store_socket};
  std::unique_ptr<StoreServer> store;
  const int port = store_socket ? store_socket->port : options.master_port;
  // With `serve`, the launcher's store (the ranks its clients); without, rank 0 serves on the launcher's socket.
  const bool launcher_store = store_socket.has_value() && serve;
  const int rank0_store_fd = store_socket && !serve ? store_socket->fd : -1;

  if (g_launch_running.exchange(true))
    throw DistributedError("launch: another launch() is running in this process; run them one after the other");
  struct Release {
    ~Release() { g_launch_running = false; }
  } release;
  SignalCatcher signals;
  ChildrenWaitable waitable;

  const int nranks = options.nproc_per_node;
  for (int restart = 0;; ++restart) {
    Attempt a;
    {
      WorkerGroup group(options, signals, program, restart, port, launcher_store, rank0_store_fd);
      if (store_socket && serve) {  // the first start: the ranks load their libraries meanwhile
        auto socket = *store_socket;
        store_socket.reset();
        store = serve(options.master_addr, socket);
      }
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

}  // namespace detail

}  // namespace fastlearn
