#include <fastlearn/launch/detail/worker_group.h>

#include <fastlearn/core/error.h>
#include <fastlearn/launch/detail/launch_serving.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <utility>

namespace fastlearn::detail {
namespace fs = std::filesystem;

namespace {

using Clock = std::chrono::steady_clock;

// After the last rank has exited: how long to wait for the end of output still held by stragglers.
constexpr auto kDrainTimeout = std::chrono::milliseconds(500);
// How often the launcher looks for stopped ranks.
constexpr int kStopCheckMs = 1000;
// Without pidfds (kernels before 5.3) rank exits are polled this often.
constexpr int kExitPollMs = 20;

bool failed(const RankExit& e) { return e.signal != 0 || e.exit_code != 0; }

}  // namespace

WorkerGroup::WorkerGroup(const LaunchOptions& o, SignalCatcher& signals, const fs::path& program, int restart, int port,
                         bool launcher_store, int rank0_store_fd)
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
  if (devnull_ < 0)
    throw DistributedError(fmt::format("launch: cannot open /dev/null for the ranks' stdin: {}", std::strerror(errno)));
  ranks_.resize(static_cast<std::size_t>(o.nproc_per_node));
  try {
    for (int local = 0; local < o.nproc_per_node; ++local) {
      RankProcess& r = ranks_[static_cast<std::size_t>(local)];
      r.exit.local_rank = local;
      r.exit.rank = o.node_rank * o.nproc_per_node + local;
      r.prefix = o.prefix_output ? fmt::format("[rank {}] ", r.exit.rank) : "";
      r.streams[0].sink = o.out;
      r.streams[1].sink = o.err;
      if (log_dir) {
        const auto path = *log_dir / fmt::format("rank{}.log", r.exit.rank);
        r.log = std::fopen(path.c_str(), "wb");
        r.log_path = path.string();
        if (!r.log)
          throw DistributedError(
              fmt::format("launch: cannot write the log file '{}': {}", path.string(), std::strerror(errno)));
      }
      ExecPlan plan;
      plan.path = program.string();
      plan.args = o.command;
      plan.env = rank_environment(o, local, restart, port, launcher_store, live);
      if (rank0_store_fd >= 0 && r.exit.rank == 0) {
        plan.inherit_fd = rank0_store_fd;
        plan.env.push_back(fmt::format("FASTLEARN_STORE_FD={}", kRankZeroStoreFd));
      }
      plan.seal();
      start_rank(r, plan, pgid_, devnull_);
      if (pgid_ == 0) pgid_ = r.exit.pid;
    }
  } catch (...) {
    kill_all(SIGKILL);
    reap_and_close();
    throw;
  }
}

WorkerGroup::~WorkerGroup() {
  // Left by an exception: nothing may outlive the launcher, and reaping must not wait on a live rank.
  if (std::any_of(ranks_.begin(), ranks_.end(),
                  [](const RankProcess& r) { return r.exit.pid > 0 && !r.reaped && !r.exited; }))
    kill_all(SIGKILL);
  reap_and_close();
}

Attempt WorkerGroup::wait() {
  Attempt a;
  bool stopping = false;
  bool killed = false;
  Clock::time_point kill_at{};
  std::optional<Clock::time_point> drain_until;
  Clock::time_point next_stop_check = Clock::now() + std::chrono::milliseconds(kStopCheckMs);

  auto stop = [&](int sig) {
    stopping = true;
    kill_at = Clock::now() + o_.grace_period;
    kill_all(sig);
  };

  std::vector<pollfd> fds;
  std::vector<std::pair<RankProcess*, int>> owners;  // what each pollfd is: (rank, stream index or -1 for its pidfd)
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
    if (!stopping) until(next_stop_check);

    const int ready = poll(fds.data(), fds.size(), timeout);
    if (ready < 0 && errno != EINTR)
      throw DistributedError(fmt::format("launch: poll() failed: {}", std::strerror(errno)));

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
        PrefixedStream& stream = rank->streams[static_cast<std::size_t>(s)];
        int log_errno = 0;
        if (!pump(stream, rank->prefix, rank->log, &log_errno)) finish(stream, rank->prefix);
        if (log_errno != 0) {  // a full disk, say: the run goes on, its output on the terminal only
          std::fprintf(o_.err,
                       "fastlearn launch: cannot write rank %d's log '%s' (%s): its output goes on to the "
                       "terminal only\n",
                       rank->exit.rank, rank->log_path.c_str(), std::strerror(log_errno));
          std::fclose(rank->log);
          rank->log = nullptr;
        }
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

    // A stopped rank (SIGSTOP, or SIGTSTP sent to it alone) holds every other rank at its next collective until
    // their timeout, 30 minutes by default, without a word: say so, and how to let it go on.
    const bool check_stops = !stopping && Clock::now() >= next_stop_check;  // not at every line of output
    if (check_stops) next_stop_check = Clock::now() + std::chrono::milliseconds(kStopCheckMs);
    for (auto& r : ranks_) {
      if (r.exited || !check_stops) continue;
      const bool stopped = is_stopped(r);
      if (stopped == r.stop_reported) continue;
      r.stop_reported = stopped;
      if (stopped) {
        std::fprintf(o_.err,
                     "fastlearn launch: rank %d (local %d, pid %d) is stopped (SIGSTOP or SIGTSTP): the other ranks "
                     "wait for it at their next collective, until their timeout; `kill -CONT %d` lets it go on\n",
                     r.exit.rank, r.exit.local_rank, r.exit.pid, r.exit.pid);
      } else {
        std::fprintf(o_.err, "fastlearn launch: rank %d (local %d, pid %d) goes on\n", r.exit.rank, r.exit.local_rank,
                     r.exit.pid);
      }
      std::fflush(o_.err);
    }

    const bool all_exited = std::all_of(ranks_.begin(), ranks_.end(), [](const RankProcess& r) { return r.exited; });
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
      const bool streams_open = std::any_of(ranks_.begin(), ranks_.end(), [](const RankProcess& r) {
        return r.streams[0].fd >= 0 || r.streams[1].fd >= 0;
      });
      if (!streams_open || Clock::now() >= *drain_until) break;
    }
  }
  // A signal that came after the last poll: every rank has ended, but it still counts (no restart after it).
  for (int sig : signals_.take()) {
    if (a.forwarded_signal) continue;
    a.forwarded_signal = sig;
    a.forwarded_first = !a.first_failure;
  }
  reap_and_close();
  return a;
}

void WorkerGroup::kill_all(int sig) {
  if (pgid_ > 0) kill(-pgid_, sig);
}

void WorkerGroup::reap_and_close() {
  for (auto& r : ranks_) {
    if (r.exit.pid > 0 && !r.reaped) {
      int status = 0;
      while (waitpid(r.exit.pid, &status, 0) < 0 && errno == EINTR) {}
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

}  // namespace fastlearn::detail
