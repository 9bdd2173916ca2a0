#include <fastlearn/distributed/store_process.h>

#include <fastlearn/core/error.h>
#include <fastlearn/distributed/worker_process.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstring>
#include <string_view>
#include <vector>

extern char** environ;

namespace fastlearn::detail {

namespace {

std::string exit_text(int status) {
  if (WIFSIGNALED(status)) return fmt::format("killed by signal {}", WTERMSIG(status));
  return fmt::format("exit code {}", WEXITSTATUS(status));
}

// Kills and reaps the child.
void discard(pid_t pid) {
  kill(pid, SIGKILL);
  while (waitpid(pid, nullptr, 0) < 0 && errno == EINTR) {}
}

class ChildStore : public StoreServer {
 public:
  ChildStore(pid_t pid, int lifeline) : pid_(pid), lifeline_(lifeline) {}
  ~ChildStore() override {
    close(lifeline_);
    discard(pid_);  // every rank has ended: nothing is left for the store to do
  }
  ChildStore(const ChildStore&) = delete;
  ChildStore& operator=(const ChildStore&) = delete;

 private:
  pid_t pid_;
  int lifeline_;
};

}  // namespace

std::unique_ptr<StoreServer> serve_store_in_child(const std::filesystem::path& program, const std::string& addr,
                                                  ListeningSocket socket, std::chrono::milliseconds start_timeout) {
  int ready[2] = {-1, -1}, lifeline[2] = {-1, -1};
  if (pipe2(ready, O_CLOEXEC) != 0 || pipe2(lifeline, O_CLOEXEC) != 0) {
    const int e = errno;
    for (int fd : {ready[0], ready[1], lifeline[0], lifeline[1], socket.fd})
      if (fd >= 0) close(fd);
    throw DistributedError(fmt::format("launch: cannot create the rendezvous store's pipes: {}", std::strerror(e)));
  }
  // Everything the child needs is made before fork(): after it, only async-signal-safe calls.
  std::vector<std::string> args{program.string(),
                                "--addr",
                                addr,
                                "--port",
                                std::to_string(socket.port),
                                "--listen-fd",
                                std::to_string(socket.fd),
                                "--ready-fd",
                                std::to_string(ready[1]),
                                "--lifeline-fd",
                                std::to_string(lifeline[0])};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  const pid_t parent = getpid();
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  const pid_t pid = fork();
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(127);
    struct sigaction action {};
    for (int sig = 1; sig < NSIG; ++sig) {
      action.sa_handler = sig == SIGINT || sig == SIGTERM || sig == SIGHUP ? SIG_IGN : SIG_DFL;
      sigaction(sig, &action, nullptr);
    }
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    close_range(3, ~0U, CLOSE_RANGE_CLOEXEC);  // nothing else of the launcher's leaks into the store
    for (int fd : {socket.fd, ready[1], lifeline[0]}) fcntl(fd, F_SETFD, 0);
    execve(argv[0], argv.data(), environ);
    exit_after_failed_exec("the rendezvous store", argv[0]);
  }
  const int fork_errno = errno;
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
  close(socket.fd);  // the child's now
  close(ready[1]);
  close(lifeline[0]);
  if (pid < 0) {
    close(ready[0]);
    close(lifeline[1]);
    throw DistributedError(
        fmt::format("launch: fork() for the rendezvous store failed: {}", std::strerror(fork_errno)));
  }
  // Wait for "ready\n"; end of file first means the child ended.
  std::string said;
  const auto deadline = std::chrono::steady_clock::now() + start_timeout;
  for (;;) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      close(ready[0]);
      close(lifeline[1]);
      discard(pid);
      throw DistributedError(fmt::format("launch: the rendezvous store ({}) did not start within {} s",
                                         program.string(), start_timeout.count() / 1000));
    }
    pollfd p{.fd = ready[0], .events = POLLIN, .revents = 0};
    const int n = poll(&p, 1, static_cast<int>(std::min<std::int64_t>(left.count(), 1000)));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) continue;
    char buffer[64];
    const auto got = read(ready[0], buffer, sizeof buffer);
    if (got < 0 && errno == EINTR) continue;
    if (got > 0) {
      said.append(buffer, static_cast<std::size_t>(got));
      if (said.find('\n') == std::string::npos) continue;
    }
    close(ready[0]);
    if (said == "ready\n") return std::make_unique<ChildStore>(pid, lifeline[1]);
    close(lifeline[1]);
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {}
    throw DistributedError(fmt::format("launch: the rendezvous store ({}) failed to start ({}); its error is above",
                                       program.string(), exit_text(status)));
  }
}

StoreChildFds parse_store_child_args(int argc, char** argv, std::string& addr, int& port) {
  StoreChildFds fds;
  const auto number = [&](std::string_view name, std::string_view text) {
    int value = -1;
    const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
    if (ec != std::errc() || end != text.data() + text.size() || value < 0)
      throw ConfigError(fmt::format("fastlearn-store: {} needs a number, got '{}'", name, text));
    return value;
  };
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string_view name = argv[i], value = argv[i + 1];
    if (name == "--addr") {
      addr = value;
    } else if (name == "--port") {
      port = number(name, value);
    } else if (name == "--listen-fd") {
      fds.listen = number(name, value);
    } else if (name == "--ready-fd") {
      fds.ready = number(name, value);
    } else if (name == "--lifeline-fd") {
      fds.lifeline = number(name, value);
    } else {
      throw ConfigError(fmt::format("fastlearn-store: unknown option '{}'", name));
    }
  }
  if (argc % 2 != 1 || addr.empty() || port <= 0 || fds.listen < 0 || fds.ready < 0 || fds.lifeline < 0) {
    throw ConfigError(
        "fastlearn-store serves `fastlearn launch`'s rendezvous store and is started by it: fastlearn-store --addr A "
        "--port P --listen-fd N --ready-fd N --lifeline-fd N");
  }
  return fds;
}

}  // namespace fastlearn::detail
