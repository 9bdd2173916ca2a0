#include <fastlearn/launch/detail/worker_process.h>

#include <fastlearn/core/error.h>
#include <fastlearn/launch/detail/launch_serving.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <string_view>
#include <thread>

extern char** environ;

namespace fastlearn::detail {

namespace {

int usable_cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) == 0) return std::max(1, CPU_COUNT(&set));
  return std::max(1u, std::thread::hardware_concurrency());
}

}  // namespace

std::vector<std::string> rank_environment(const LaunchOptions& o, int local_rank, int restart, int port,
                                          bool launcher_store, bool live) {
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
  if (launcher_store) vars["TORCHELASTIC_USE_AGENT_STORE"] = std::string("True");
  if (!o.run_id.empty()) vars["FASTLEARN_RUN_ID"] = fmt::format("{}.{}", o.run_id, restart);
  // std::string("1"), not "1": assigning the literal here trips a false -Wstringop-overflow in GCC 12.
  if (live && rank == 0) vars["FASTLEARN_PROGRESS_LIVE"] = std::string("1");
  if (!std::getenv("OMP_NUM_THREADS") && !o.extra_env.count("OMP_NUM_THREADS"))
    vars["OMP_NUM_THREADS"] = std::to_string(std::max(1, usable_cores() / o.nproc_per_node));

  std::vector<std::string> env;
  for (char** e = environ; *e; ++e) {
    const std::string_view entry(*e);
    const auto key = entry.substr(0, entry.find('='));
    // Ours replace inherited ones; stale ones of an outer launch must not leak to the ranks.
    if (!vars.count(std::string(key)) && key != "FASTLEARN_PROGRESS_LIVE" && key != "FASTLEARN_RUN_ID" &&
        key != "TORCHELASTIC_USE_AGENT_STORE" && key != "FASTLEARN_STORE_FD")
      env.emplace_back(entry);
  }
  for (const auto& [key, value] : vars) env.push_back(key + "=" + value);
  return env;
}

void ExecPlan::seal() {
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  for (auto& e : env) envp.push_back(e.data());
  envp.push_back(nullptr);
  rlimit files{};
  fd_limit = getrlimit(RLIMIT_NOFILE, &files) == 0 && files.rlim_cur != RLIM_INFINITY
                 ? static_cast<int>(std::min<rlim_t>(files.rlim_cur, 1 << 20))
                 : 1 << 16;
}

void mark_cloexec_from(int first, int limit) {
  for (int fd = first; fd < limit; ++fd) {
    const int flags = fcntl(fd, F_GETFD);
    if (flags >= 0 && !(flags & FD_CLOEXEC)) fcntl(fd, F_SETFD, flags | FD_CLOEXEC);
  }
}

void exit_after_failed_exec(const char* what, const char* program) {
  // Only async-signal-safe calls after fork: strerrordesc_np reads a static table (strerror may allocate).
  const char* parts[] = {
      "fastlearn launch: execve() of ", what, " '", program, "' failed: ", strerrordesc_np(errno), "\n"};
  for (const char* part : parts) {
    if (part) [[maybe_unused]]
      auto n = write(STDERR_FILENO, part, std::strlen(part));
  }
  _exit(127);
}

void start_rank(RankProcess& r, const ExecPlan& plan, pid_t group, int stdin_fd) {
  std::array<int, 2> out{-1, -1};
  std::array<int, 2> err{-1, -1};
  if (pipe2(out.data(), O_CLOEXEC) != 0 || pipe2(err.data(), O_CLOEXEC) != 0) {
    const int e = errno;
    for (int fd : {out[0], out[1], err[0], err[1]})
      if (fd >= 0) close(fd);
    throw DistributedError(
        fmt::format("launch: cannot create the output pipes of rank {}: {}", r.exit.rank, std::strerror(e)));
  }
  const pid_t parent = getpid();
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
    dup2(stdin_fd, STDIN_FILENO);
    dup2(out[1], STDOUT_FILENO);
    dup2(err[1], STDERR_FILENO);
    struct sigaction dfl {};
    dfl.sa_handler = SIG_DFL;
    for (int sig = 1; sig < NSIG; ++sig) sigaction(sig, &dfl, nullptr);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    // No descriptor of the launcher's process leaks into a rank (close_range's flag needs Linux 5.11).
    if (close_range(3, ~0U, CLOSE_RANGE_CLOEXEC) != 0) mark_cloexec_from(3, plan.fd_limit);
    if (plan.inherit_fd == kRankZeroStoreFd)
      fcntl(kRankZeroStoreFd, F_SETFD, 0);  // dup2 onto itself would keep its close-on-exec flag
    else if (plan.inherit_fd >= 0)
      dup2(plan.inherit_fd, kRankZeroStoreFd);
    execve(plan.path.c_str(), plan.argv.data(), plan.envp.data());
    exit_after_failed_exec("the rank's program", plan.path.c_str());
  }
  const int fork_errno = errno;
  if (pid > 0) setpgid(pid, group == 0 ? pid : group);  // also here: no race with the first kill of the group
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
  close(out[1]);
  close(err[1]);
  if (pid < 0) {
    close(out[0]);
    close(err[0]);
    throw DistributedError(
        fmt::format("launch: fork() for rank {} failed: {}", r.exit.rank, std::strerror(fork_errno)));
  }
  r.exit.pid = pid;
  // glibc 2.36 declares pidfd_open() without C linkage, so go through syscall(); -1 before Linux 5.3: exits are then
  // polled.
  r.pidfd = static_cast<int>(syscall(SYS_pidfd_open, pid, 0));
  r.streams[0].fd = out[0];
  r.streams[1].fd = err[0];
  for (int fd : {out[0], err[0]}) fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
}

bool is_stopped(const RankProcess& rank) {
  std::ifstream stat(fmt::format("/proc/{}/stat", rank.exit.pid));
  std::string text;
  std::getline(stat, text);
  const auto name_end = text.rfind(')');  // "pid (name) S ...": the name may hold spaces and parentheses
  return name_end != std::string::npos && name_end + 2 < text.size() && text[name_end + 2] == 'T';
}

bool check_exit(RankProcess& rank) {
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

}  // namespace fastlearn::detail
