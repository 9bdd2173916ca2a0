#include <fastlearn/distributed/launcher.h>

#include <fastlearn/core/error.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sched.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <random>
#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <thread>

extern char** environ;

namespace fastlearn {
namespace fs = std::filesystem;

namespace {

using Clock = std::chrono::steady_clock;

// Variables the launcher owns; extra_env may not set them.
constexpr std::array kReservedVariables{
    "RANK",        "WORLD_SIZE",  "LOCAL_RANK",                 "LOCAL_WORLD_SIZE",          "GROUP_RANK", "GROUP_WORLD_SIZE",
    "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS", "FASTLEARN_PROGRESS_LIVE",
    "FASTLEARN_RUN_ID"};
// A partial line longer than this is written out anyway (a program that never ends its lines).
constexpr std::size_t kMaxHeldLine = 64 * 1024;
// After the last rank has exited: how long to wait for the end of output still held by stragglers.
constexpr auto kDrainTimeout = std::chrono::milliseconds(500);
// Without pidfds (kernels before 5.3) rank exits are polled this often.
constexpr int kExitPollMs = 20;

std::string errno_text(int err = errno) { return std::strerror(err); }

// ---- signals sent to the launcher ---------------------------------------------------------------

std::atomic<int> g_signal_fd{-1};
std::atomic<bool> g_launch_running{false};

extern "C" void on_launcher_signal(int sig) {
  const int saved = errno;
  const unsigned char byte = static_cast<unsigned char>(sig);
  if (const int fd = g_signal_fd.load(); fd >= 0) {
    [[maybe_unused]] const auto n = write(fd, &byte, 1);
  }
  errno = saved;
}

// While alive, SIGINT and SIGTERM of the process become bytes on a pipe that the poll loop reads
// (the self-pipe trick: a handler may only do async-signal-safe things). Signals the process ignores
// (a background job's SIGINT) stay ignored.
class SignalCatcher {
 public:
  SignalCatcher() {
    if (pipe2(fds_.data(), O_CLOEXEC | O_NONBLOCK) != 0)
      throw DistributedError(fmt::format("launch: cannot create the signal pipe: {}", errno_text()));
    g_signal_fd = fds_[1];
    struct sigaction action {};
    action.sa_handler = on_launcher_signal;
    sigemptyset(&action.sa_mask);
    action.sa_flags = SA_RESTART;
    for (std::size_t i = 0; i < kSignals.size(); ++i) {
      sigaction(kSignals[i], nullptr, &previous_[i]);
      if (previous_[i].sa_handler != SIG_IGN) sigaction(kSignals[i], &action, nullptr);
    }
  }
  ~SignalCatcher() {
    for (std::size_t i = 0; i < kSignals.size(); ++i) sigaction(kSignals[i], &previous_[i], nullptr);
    g_signal_fd = -1;
    close(fds_[0]);
    close(fds_[1]);
  }
  SignalCatcher(const SignalCatcher&) = delete;
  SignalCatcher& operator=(const SignalCatcher&) = delete;

  int fd() const { return fds_[0]; }

  /// Signals received since the last call, in order.
  std::vector<int> take() {
    std::vector<int> signals;
    unsigned char buffer[64];
    ssize_t n = 0;
    while ((n = read(fds_[0], buffer, sizeof buffer)) > 0) signals.insert(signals.end(), buffer, buffer + n);
    return signals;
  }

 private:
  static constexpr std::array<int, 2> kSignals{SIGINT, SIGTERM};
  std::array<int, 2> fds_{-1, -1};
  std::array<struct sigaction, 2> previous_{};
};

// ---- options ------------------------------------------------------------------------------------------

bool is_executable_file(const fs::path& path) {
  struct stat st {};
  return stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) && access(path.c_str(), X_OK) == 0;
}

// The file execve() will run for `program`: as given when it has a '/', else the first match in PATH.
fs::path resolve_program(const std::string& program) {
  if (program.empty()) throw ConfigError("launch: the command's program is an empty string; pass a program to run");
  if (program.find('/') != std::string::npos) {
    if (!fs::exists(program))
      throw ConfigError(fmt::format("launch: program '{}' does not exist; check the path of the command", program));
    if (!is_executable_file(program))
      throw ConfigError(
          fmt::format("launch: program '{}' is not an executable file; check its path and mode (chmod +x)", program));
    return program;
  }
  const char* path_env = std::getenv("PATH");
  const std::string path = path_env && *path_env ? path_env : "/usr/local/bin:/usr/bin:/bin";
  std::size_t start = 0;
  for (;;) {
    const auto end = path.find(':', start);
    const std::string dir = path.substr(start, end == std::string::npos ? std::string::npos : end - start);
    const fs::path candidate = fs::path(dir.empty() ? "." : dir) / program;
    if (is_executable_file(candidate)) return candidate;
    if (end == std::string::npos) break;
    start = end + 1;
  }
  throw ConfigError(
      fmt::format("launch: program '{}' was not found in PATH ({}); pass its full path or fix PATH", program, path));
}

void validate(const LaunchOptions& o) {
  auto fail = [](const std::string& what) { throw ConfigError("launch: " + what); };
  if (o.nproc_per_node < 1)
    fail(
        fmt::format("nproc_per_node is {}; it must be at least 1 (processes to start on this node)", o.nproc_per_node));
  if (o.nnodes < 1) fail(fmt::format("nnodes is {}; it must be at least 1", o.nnodes));
  if (o.node_rank < 0 || o.node_rank >= o.nnodes)
    fail(fmt::format("node_rank is {} but nnodes is {}; node_rank must be in [0, {}]", o.node_rank, o.nnodes,
                     o.nnodes - 1));
  if (o.master_addr.empty()) fail("master_addr is empty; pass the address of the node that runs rank 0");
  if (o.master_port < 0 || o.master_port > 65535)
    fail(fmt::format("master_port {} is not a TCP port; pass 1-65535, or 0 for a free one (single node)",
                     o.master_port));
  if (o.master_port == 0 && o.nnodes > 1)
    fail(
        fmt::format("master_port 0 (pick a free port) only works on one node; with {} nodes pass the same "
                    "explicit master_port to every node",
                    o.nnodes));
  if (o.max_restarts < 0) fail(fmt::format("max_restarts is {}; it must be 0 or more", o.max_restarts));
  if (o.grace_period.count() < 0)
    fail(fmt::format("grace_period is {} ms; it must be 0 or more", o.grace_period.count()));
  if (o.command.empty()) fail("the command is empty; pass the program to run and its arguments");
  for (const auto& [key, value] : o.extra_env) {
    if (key.empty() || key.find('=') != std::string::npos)
      fail(fmt::format("extra_env has the invalid variable name '{}'", key));
    if (std::find(kReservedVariables.begin(), kReservedVariables.end(), key) != kReservedVariables.end())
      fail(
          fmt::format("extra_env sets {}, which the launcher sets for each rank; use the launch options instead", key));
  }
  if (!o.out || !o.err) fail("the out and err streams must not be null");
}

int usable_cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) == 0) return std::max(1, CPU_COUNT(&set));
  return std::max(1u, std::thread::hardware_concurrency());
}

// ---- ranks --------------------------------------------------------------------------------------------

// One output pipe of a rank: bytes are cut into segments that end with '\n' or '\r' and written with the prefix.
struct Stream {
  int fd = -1;
  std::FILE* sink = nullptr;
  std::string held;           // a segment still waiting for its end
  bool at_line_start = true;  // the next bytes written start a segment: write the prefix first
  bool after_cr = false;      // the last segment ended with '\r': a '\n' right after it completes a "\r\n"
};

struct Rank {
  RankExit exit;
  int pidfd = -1;
  std::array<Stream, 2> streams;  // stdout, stderr
  std::FILE* log = nullptr;
  bool exited = false;  // its exit status is known (it may not be reaped yet)
  bool reaped = false;
  std::string prefix;
};

void write_segment(Stream& s, const std::string& prefix, const char* data, std::size_t size) {
  if (size == 0) return;
  if (s.at_line_start) std::fwrite(prefix.data(), 1, prefix.size(), s.sink);
  std::fwrite(data, 1, size, s.sink);
  const char last = data[size - 1];
  s.at_line_start = last == '\n' || last == '\r';
}

void consume(Stream& s, const std::string& prefix, const char* data, std::size_t size) {
  std::size_t i = 0;
  if (s.after_cr && size > 0 && data[0] == '\n') {
    // The '\n' of a "\r\n" split across two reads: it belongs to the segment already written.
    std::fputc('\n', s.sink);
    i = 1;
  }
  s.after_cr = false;
  while (i < size) {
    const void* hit_n = std::memchr(data + i, '\n', size - i);
    const void* hit_r = std::memchr(data + i, '\r', size - i);
    const char* end = nullptr;
    if (hit_n && hit_r)
      end = std::min(static_cast<const char*>(hit_n), static_cast<const char*>(hit_r));
    else
      end = static_cast<const char*>(hit_n ? hit_n : hit_r);
    if (!end) {
      s.held.append(data + i, size - i);
      s.after_cr = false;
      if (s.held.size() > kMaxHeldLine) {
        write_segment(s, prefix, s.held.data(), s.held.size());
        s.held.clear();
      }
      return;
    }
    std::size_t stop = static_cast<std::size_t>(end - data) + 1;
    if (*end == '\r' && stop < size && data[stop] == '\n') ++stop;  // "\r\n" is one line end
    s.held.append(data + i, stop - i);
    write_segment(s, prefix, s.held.data(), s.held.size());
    s.held.clear();
    s.after_cr = *end == '\r' && stop == static_cast<std::size_t>(end - data) + 1;
    i = stop;
  }
}

// The end of a stream: what is still held is written as a last line.
void finish(Stream& s, const std::string& prefix) {
  if (!s.held.empty()) {
    s.held.push_back('\n');
    write_segment(s, prefix, s.held.data(), s.held.size());
    s.held.clear();
  }
  if (s.fd >= 0) close(s.fd);
  s.fd = -1;
}

// Reads what a stream has now (bounded, so one chatty rank cannot starve the loop). False at its end.
bool pump(Rank& rank, Stream& s) {
  char buffer[16384];
  for (int round = 0; round < 8; ++round) {
    const ssize_t n = read(s.fd, buffer, sizeof buffer);
    if (n > 0) {
      if (rank.log) {
        std::fwrite(buffer, 1, static_cast<std::size_t>(n), rank.log);
        std::fflush(rank.log);
      }
      consume(s, rank.prefix, buffer, static_cast<std::size_t>(n));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return true;
    return false;  // EOF, or an error that ends the stream all the same
  }
  return true;
}

// Records the rank's exit if it has ended, leaving it a zombie: its pid (and with rank 0 the group's id)
// stays reserved until the final reap, so signals to the group can never reach a recycled id.
bool check_exit(Rank& rank) {
  siginfo_t info{};
  if (waitid(P_PID, static_cast<id_t>(rank.exit.pid), &info, WEXITED | WNOHANG | WNOWAIT) != 0) {
    if (errno == EINTR) return false;
    // ECHILD: someone else reaped it (SIGCHLD ignored in this process); its status is lost.
    rank.exited = true;
    rank.exit.exit_code = 255;
    return true;
  }
  if (info.si_pid == 0) return false;
  rank.exited = true;
  if (info.si_code == CLD_EXITED) {
    rank.exit.exit_code = info.si_status;
  } else {
    rank.exit.exit_code = -1;
    rank.exit.signal = info.si_status;
  }
  return true;
}

bool failed(const RankExit& e) { return e.signal != 0 || e.exit_code != 0; }

int exit_code_of(const RankExit& e) { return e.signal != 0 ? 128 + e.signal : e.exit_code; }

struct Attempt {
  std::optional<RankExit> first_failure;
  int forwarded_signal = 0;             // a SIGINT/SIGTERM the launcher received and passed on
  bool forwarded_first = false;         // ... before any rank failed
  std::vector<int> killed_after_grace;  // ranks still alive when the grace period ended
  int nranks = 0;
};

// Everything a child needs, prepared before fork(): between fork() and execve() only async-signal-safe calls.
struct ExecPlan {
  std::string path;
  std::vector<std::string> args;
  std::vector<std::string> env;
  std::vector<char*> argv;
  std::vector<char*> envp;
  void seal() {
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    for (auto& e : env) envp.push_back(e.data());
    envp.push_back(nullptr);
  }
};

std::vector<std::string> rank_environment(const LaunchOptions& o, int local_rank, int restart, int port, bool live) {
  const int rank = o.node_rank * o.nproc_per_node + local_rank;
  std::map<std::string, std::string> vars = o.extra_env;
  vars["RANK"] = std::to_string(rank);
  vars["WORLD_SIZE"] = std::to_string(o.nnodes * o.nproc_per_node);
  vars["LOCAL_RANK"] = std::to_string(local_rank);
  vars["LOCAL_WORLD_SIZE"] = std::to_string(o.nproc_per_node);
  vars["GROUP_RANK"] = std::to_string(o.node_rank);
  vars["GROUP_WORLD_SIZE"] = std::to_string(o.nnodes);
  vars["MASTER_ADDR"] = o.master_addr;
  vars["MASTER_PORT"] = std::to_string(port);
  vars["TORCHELASTIC_RESTART_COUNT"] = std::to_string(restart);
  vars["TORCHELASTIC_MAX_RESTARTS"] = std::to_string(o.max_restarts);
  if (!o.run_id.empty()) vars["FASTLEARN_RUN_ID"] = fmt::format("{}.{}", o.run_id, restart);
  if (live && rank == 0) vars["FASTLEARN_PROGRESS_LIVE"] = "1";
  if (!std::getenv("OMP_NUM_THREADS") && !o.extra_env.count("OMP_NUM_THREADS"))
    vars["OMP_NUM_THREADS"] = std::to_string(std::max(1, usable_cores() / o.nproc_per_node));

  std::vector<std::string> env;
  for (char** e = environ; *e; ++e) {
    const std::string_view entry(*e);
    const auto key = entry.substr(0, entry.find('='));
    // Ours replace inherited ones; a stale FASTLEARN_PROGRESS_LIVE must not leak to other ranks.
    if (!vars.count(std::string(key)) && key != "FASTLEARN_PROGRESS_LIVE" && key != "FASTLEARN_RUN_ID") env.emplace_back(entry);
  }
  for (const auto& [key, value] : vars) env.push_back(key + "=" + value);
  return env;
}

class Group {
 public:
  Group(const LaunchOptions& o, SignalCatcher& signals, const fs::path& program, int restart, int port)
      : o_(o), signals_(signals) {
    const bool live = isatty(fileno(o.out)) == 1;
    std::optional<fs::path> log_dir;
    if (o.log_dir) {
      log_dir = restart == 0 ? *o.log_dir : *o.log_dir / fmt::format("restart_{}", restart);
      std::error_code ec;
      fs::create_directories(*log_dir, ec);
      if (ec)
        throw DistributedError(
            fmt::format("launch: cannot create the log folder '{}': {}", log_dir->string(), ec.message()));
    }
    devnull_ = open("/dev/null", O_RDONLY | O_CLOEXEC);
    ranks_.resize(static_cast<std::size_t>(o.nproc_per_node));
    try {
      for (int local = 0; local < o.nproc_per_node; ++local) {
        Rank& r = ranks_[static_cast<std::size_t>(local)];
        r.exit.local_rank = local;
        r.exit.rank = o.node_rank * o.nproc_per_node + local;
        r.prefix = o.prefix_output ? fmt::format("[rank {}] ", r.exit.rank) : "";
        r.streams[0].sink = o.out;
        r.streams[1].sink = o.err;
        if (log_dir) {
          const auto path = *log_dir / fmt::format("rank{}.log", r.exit.rank);
          r.log = std::fopen(path.c_str(), "wb");
          if (!r.log)
            throw DistributedError(
                fmt::format("launch: cannot write the log file '{}': {}", path.string(), errno_text()));
        }
        ExecPlan plan;
        plan.path = program.string();
        plan.args = o.command;
        plan.env = rank_environment(o, local, restart, port, live);
        plan.seal();
        start(r, plan);
      }
    } catch (...) {
      kill_all(SIGKILL);
      reap_and_close();
      throw;
    }
  }

  ~Group() {
    // Left by an exception: nothing may outlive the launcher, and reaping must not wait on a live rank.
    if (std::any_of(ranks_.begin(), ranks_.end(),
                    [](const Rank& r) { return r.exit.pid > 0 && !r.reaped && !r.exited; }))
      kill_all(SIGKILL);
    reap_and_close();
  }
  Group(const Group&) = delete;
  Group& operator=(const Group&) = delete;

  /// Runs the poll loop until every rank has ended.
  Attempt wait() {
    Attempt a;
    a.nranks = static_cast<int>(ranks_.size());
    bool stopping = false;
    bool killed = false;
    Clock::time_point kill_at{};
    std::optional<Clock::time_point> drain_until;

    auto stop = [&](int sig) {
      stopping = true;
      kill_at = Clock::now() + o_.grace_period;
      kill_all(sig);
    };

    std::vector<pollfd> fds;
    std::vector<std::pair<Rank*, int>> owners;  // what each pollfd is: (rank, stream index or -1 for its pidfd)
    for (;;) {
      fds.clear();
      owners.clear();
      fds.push_back({signals_.fd(), POLLIN, 0});
      owners.emplace_back(nullptr, 0);
      bool polling_exits = false;
      for (auto& r : ranks_) {
        for (int s = 0; s < 2; ++s) {
          if (r.streams[static_cast<std::size_t>(s)].fd < 0) continue;
          fds.push_back({r.streams[static_cast<std::size_t>(s)].fd, POLLIN, 0});
          owners.emplace_back(&r, s);
        }
        if (r.exited) continue;
        if (r.pidfd >= 0) {
          fds.push_back({r.pidfd, POLLIN, 0});
          owners.emplace_back(&r, -1);
        } else {
          polling_exits = true;
        }
      }

      int timeout = -1;
      const auto now = Clock::now();
      auto until = [&](Clock::time_point t) {
        const auto ms = std::chrono::ceil<std::chrono::milliseconds>(t - now).count();
        const int left = static_cast<int>(std::clamp<long long>(ms, 0, 60'000));
        timeout = timeout < 0 ? left : std::min(timeout, left);
      };
      if (stopping && !killed) until(kill_at);
      if (drain_until) until(*drain_until);
      if (polling_exits) timeout = timeout < 0 ? kExitPollMs : std::min(timeout, kExitPollMs);

      const int ready = poll(fds.data(), fds.size(), timeout);
      if (ready < 0 && errno != EINTR) throw DistributedError(fmt::format("launch: poll() failed: {}", errno_text()));

      for (int sig : signals_.take()) {
        if (!stopping) {
          a.forwarded_signal = sig;
          a.forwarded_first = !a.first_failure;
          stop(sig);
        } else {
          if (!a.forwarded_signal) a.forwarded_signal = sig;
          // A signal while already stopping (after a failure or a first signal): do not wait for the grace period.
          kill_all(SIGKILL);
          killed = true;
        }
      }

      for (std::size_t i = 1; ready > 0 && i < fds.size(); ++i) {
        if (fds[i].revents == 0) continue;
        auto [rank, s] = owners[i];
        if (s >= 0) {
          Stream& stream = rank->streams[static_cast<std::size_t>(s)];
          if (!pump(*rank, stream)) finish(stream, rank->prefix);
        }
      }
      std::fflush(o_.out);
      std::fflush(o_.err);

      for (auto& r : ranks_) {
        if (r.exited || !check_exit(r)) continue;
        if (!stopping && failed(r.exit)) {
          a.first_failure = r.exit;
          stop(SIGTERM);
        }
      }

      const bool all_exited = std::all_of(ranks_.begin(), ranks_.end(), [](const Rank& r) { return r.exited; });
      if (stopping && !killed && !all_exited && Clock::now() >= kill_at) {
        for (const auto& r : ranks_)
          if (!r.exited) a.killed_after_grace.push_back(r.exit.rank);
        kill_all(SIGKILL);
        killed = true;
      }
      if (all_exited) {
        if (!drain_until) {
          // Processes the ranks left behind in their group die now; their ends of the pipes close with them.
          kill_all(SIGKILL);
          drain_until = Clock::now() + kDrainTimeout;
        }
        const bool streams_open = std::any_of(
            ranks_.begin(), ranks_.end(), [](const Rank& r) { return r.streams[0].fd >= 0 || r.streams[1].fd >= 0; });
        if (!streams_open || Clock::now() >= *drain_until) break;
      }
    }
    reap_and_close();
    return a;
  }

 private:
  void start(Rank& r, ExecPlan& plan) {
    std::array<int, 2> out{-1, -1};
    std::array<int, 2> err{-1, -1};
    if (pipe2(out.data(), O_CLOEXEC) != 0 || pipe2(err.data(), O_CLOEXEC) != 0) {
      const int e = errno;
      for (int fd : {out[0], out[1], err[0], err[1]})
        if (fd >= 0) close(fd);
      throw DistributedError(
          fmt::format("launch: cannot create the output pipes of rank {}: {}", r.exit.rank, errno_text(e)));
    }
    const pid_t parent = getpid();
    const pid_t group = pgid_;
    // Signals stay blocked across fork(), so our handler never runs in the child before it is reset.
    sigset_t all;
    sigset_t old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    const pid_t pid = fork();
    if (pid == 0) {
      setpgid(0, group);
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (getppid() != parent) _exit(127);  // the launcher died before the line above
      dup2(devnull_, STDIN_FILENO);
      dup2(out[1], STDOUT_FILENO);
      dup2(err[1], STDERR_FILENO);
      struct sigaction dfl {};
      dfl.sa_handler = SIG_DFL;
      for (int sig = 1; sig < NSIG; ++sig) sigaction(sig, &dfl, nullptr);
      sigset_t none;
      sigemptyset(&none);
      sigprocmask(SIG_SETMASK, &none, nullptr);
      close_range(3, ~0U, CLOSE_RANGE_CLOEXEC);  // no descriptor of the launcher's process leaks into a rank
      execve(plan.path.c_str(), plan.argv.data(), plan.envp.data());
      constexpr char msg[] = "fastlearn launch: execve() of the rank's program failed\n";
      [[maybe_unused]] auto n = write(STDERR_FILENO, msg, sizeof msg - 1);
      _exit(127);
    }
    const int fork_errno = errno;
    if (pid > 0) setpgid(pid, group == 0 ? pid : group);  // also here: no race with the first kill_all
    pthread_sigmask(SIG_SETMASK, &old, nullptr);
    close(out[1]);
    close(err[1]);
    if (pid < 0) {
      close(out[0]);
      close(err[0]);
      throw DistributedError(fmt::format("launch: fork() for rank {} failed: {}", r.exit.rank, errno_text(fork_errno)));
    }
    if (pgid_ == 0) pgid_ = pid;
    r.exit.pid = pid;
    // glibc 2.36 declares pidfd_open() without C linkage, so go through syscall(); -1 before Linux 5.3: exits are then
    // polled.
    r.pidfd = static_cast<int>(syscall(SYS_pidfd_open, pid, 0));
    r.streams[0].fd = out[0];
    r.streams[1].fd = err[0];
    for (int fd : {out[0], err[0]}) fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
  }

  void kill_all(int sig) {
    if (pgid_ > 0) kill(-pgid_, sig);
  }

  void reap_and_close() {
    for (auto& r : ranks_) {
      if (r.exit.pid > 0 && !r.reaped) {
        int status = 0;
        while (waitpid(r.exit.pid, &status, 0) < 0 && errno == EINTR) {
        }
        r.reaped = true;
      }
      if (r.pidfd >= 0) close(r.pidfd);
      r.pidfd = -1;
      for (auto& s : r.streams)
        if (s.fd >= 0) finish(s, r.prefix);
      if (r.log) std::fclose(r.log);
      r.log = nullptr;
    }
    std::fflush(o_.out);
    std::fflush(o_.err);
    if (devnull_ >= 0) close(devnull_);
    devnull_ = -1;
  }

  const LaunchOptions& o_;
  SignalCatcher& signals_;
  std::vector<Rank> ranks_;
  pid_t pgid_ = 0;
  int devnull_ = -1;
};

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
      last_error = errno_text();
      continue;
    }
    sockaddr_storage bound{};
    socklen_t length = sizeof bound;
    const bool ok =
        bind(fd, a->ai_addr, a->ai_addrlen) == 0 && getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &length) == 0;
    if (!ok) last_error = errno_text();
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
  validate(given);
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
  if (options.master_port == 0) pick_free_port(options.master_addr);  // a bad address is an option error, up front

  if (g_launch_running.exchange(true))
    throw DistributedError("launch: another launch() is running in this process; run them one after the other");
  struct Release {
    ~Release() { g_launch_running = false; }
  } release;
  SignalCatcher signals;

  const int nranks = options.nproc_per_node;
  for (int restart = 0;; ++restart) {
    const int port = options.master_port != 0 ? options.master_port : pick_free_port(options.master_addr);
    Attempt a;
    {
      Group group(options, signals, program, restart, port);
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
