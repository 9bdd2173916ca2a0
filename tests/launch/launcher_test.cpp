// The launcher (launch(), `fastlearn launch`) and spawn(), driven by the launch_probe program.
#include <fastlearn/comm/spawn.h>
#include <fastlearn/core/error.h>
#include <fastlearn/launch/detail/worker_process.h>
#include <fastlearn/launch/launcher.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <sched.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "support/build_paths.h"
#include "support/processes.h"

extern char** environ;

namespace {

namespace fs = std::filesystem;
namespace fl = fastlearn;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

constexpr milliseconds kGrace{1000};

std::string current_test() {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  return fmt::format("{}.{}", info->test_suite_name(), info->name());
}

// A fresh folder, removed at the end of the test.
struct TempDir {
  fs::path path;
  TempDir() {
    std::string pattern = (fs::temp_directory_path() / "fastlearn-launch-test-XXXXXX").string();
    path = mkdtemp(pattern.data());
  }
  ~TempDir() { fs::remove_all(path); }
};

// A FILE* over a temporary file that the test reads back after the launch.
struct Capture {
  std::FILE* file = std::tmpfile();
  ~Capture() { std::fclose(file); }
  std::string text() const {
    std::fflush(file);
    std::string s;
    std::rewind(file);
    char buf[4096];
    while (auto n = std::fread(buf, 1, sizeof buf, file)) s.append(buf, n);
    return s;
  }
};

std::string read_text(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

using Record = std::map<std::string, std::string>;

// What launch_probe's record=DIR wrote for `rank` on restart `restart` (empty when it did not).
Record read_record(const fs::path& dir, int rank, int restart = 0) {
  Record r;
  std::ifstream in(dir / fmt::format("rank{}.restart{}", rank, restart));
  std::string line;
  while (std::getline(in, line)) {
    const auto eq = line.find('=');
    if (eq != std::string::npos) r.emplace(line.substr(0, eq), line.substr(eq + 1));
  }
  return r;
}

// Alive and not a zombie (an orphan that init has not reaped yet is dead for us).
bool alive(int pid) {
  if (pid <= 0 || kill(pid, 0) != 0) return false;
  // read(), not a stream: the process may vanish while we read (ESRCH), which libstdc++ streams throw on.
  const int fd = open(fmt::format("/proc/{}/stat", pid).c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  char buffer[512];
  const ssize_t n = read(fd, buffer, sizeof buffer);
  close(fd);
  if (n <= 0) return false;
  const std::string content(buffer, static_cast<std::size_t>(n));
  const auto paren = content.rfind(')');
  return paren == std::string::npos || paren + 2 >= content.size() || content[paren + 2] != 'Z';
}

// Every rank pid and grandchild pid that the records of `restart` name is gone (waits up to 500 ms).
void expect_all_gone(const fs::path& dir, int nranks, int restart = 0) {
  for (int rank = 0; rank < nranks; ++rank) {
    const auto rec = read_record(dir, rank, restart);
    for (const char* key : {"probe.pid", "probe.grandchild"}) {
      if (!rec.count(key)) continue;
      const int pid = std::stoi(rec.at(key));
      const auto until = Clock::now() + milliseconds(500);
      while (alive(pid) && Clock::now() < until) std::this_thread::sleep_for(milliseconds(10));
      EXPECT_FALSE(alive(pid)) << key << " " << pid << " of rank " << rank << " is still running";
    }
  }
}

// Seconds from the monotonic stamp launch_probe wrote to now.
double seconds_since_stamp(const fs::path& file) {
  const long long ns = std::stoll(read_text(file));
  const auto now = std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count();
  return static_cast<double>(now - ns) / 1e9;
}

fl::LaunchOptions probe(int nproc, std::vector<std::string> args, const Capture& out, const Capture& err) {
  fl::LaunchOptions o;
  o.nproc_per_node = nproc;
  o.grace_period = kGrace;
  o.command = {FASTLEARN_LAUNCH_PROBE};
  o.command.insert(o.command.end(), args.begin(), args.end());
  o.out = out.file;
  o.err = err.file;
  return o;
}

struct ScopedEnv {
  std::string name;
  std::optional<std::string> old;
  ScopedEnv(std::string n, const char* value) : name(std::move(n)) {
    if (const char* v = std::getenv(name.c_str())) old = v;
    if (value)
      setenv(name.c_str(), value, 1);
    else
      unsetenv(name.c_str());
  }
  ~ScopedEnv() {
    if (old)
      setenv(name.c_str(), old->c_str(), 1);
    else
      unsetenv(name.c_str());
  }
};

int usable_cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  sched_getaffinity(0, sizeof set, &set);
  return CPU_COUNT(&set);
}

// ---- environment ----------------------------------------------------------------------------------------

TEST(Launcher, EveryRankGetsTheTorchrunEnvironment) {
  TempDir dir;
  Capture out, err;
  ScopedEnv omp("OMP_NUM_THREADS", nullptr);
  ScopedEnv live("FASTLEARN_PROGRESS_LIVE", "1");  // stale in the launcher's environment: must not reach the ranks
  auto o = probe(3, {"record=" + dir.path.string()}, out, err);
  o.extra_env = {{"FASTLEARN_TEST_EXTRA", "yes"}};
  const auto result = fl::launch(o);
  ASSERT_EQ(result.exit_code, 0) << result.summary << "\n" << err.text();
  EXPECT_EQ(result.restarts, 0);
  EXPECT_FALSE(result.first_failure);

  std::set<std::string> pids;
  std::string port;
  for (int rank = 0; rank < 3; ++rank) {
    auto env = read_record(dir.path, rank);
    ASSERT_FALSE(env.empty()) << "rank " << rank << " wrote no record";
    EXPECT_EQ(env["RANK"], std::to_string(rank));
    EXPECT_EQ(env["LOCAL_RANK"], std::to_string(rank));
    EXPECT_EQ(env["WORLD_SIZE"], "3");
    EXPECT_EQ(env["LOCAL_WORLD_SIZE"], "3");
    EXPECT_EQ(env["GROUP_RANK"], "0");
    EXPECT_EQ(env["GROUP_WORLD_SIZE"], "1");
    EXPECT_EQ(env["MASTER_ADDR"], "127.0.0.1");
    EXPECT_EQ(env["TORCHELASTIC_RESTART_COUNT"], "0");
    EXPECT_EQ(env["TORCHELASTIC_MAX_RESTARTS"], "0");
    EXPECT_EQ(env["OMP_NUM_THREADS"], std::to_string(std::max(1, usable_cores() / 3)));
    EXPECT_EQ(env["TORCHELASTIC_USE_AGENT_STORE"], "True") << "no port given: the launcher serves the store";
    EXPECT_EQ(env["FASTLEARN_TEST_EXTRA"], "yes");
    EXPECT_EQ(env.count("FASTLEARN_PROGRESS_LIVE"), 0u) << "out is not a terminal";
    EXPECT_GT(std::stoi(env["MASTER_PORT"]), 0);
    if (rank == 0) port = env["MASTER_PORT"];
    EXPECT_EQ(env["MASTER_PORT"], port) << "all ranks meet at one port";
    pids.insert(env["probe.pid"]);
  }
  EXPECT_EQ(pids.size(), 3u) << "one process per rank";
}

TEST(Launcher, OmpNumThreadsAlreadySetIsKept) {
  TempDir dir;
  Capture out, err;
  {
    ScopedEnv omp("OMP_NUM_THREADS", "7");
    ASSERT_EQ(fl::launch(probe(2, {"record=" + dir.path.string()}, out, err)).exit_code, 0) << err.text();
    EXPECT_EQ(read_record(dir.path, 0)["OMP_NUM_THREADS"], "7");
    EXPECT_EQ(read_record(dir.path, 1)["OMP_NUM_THREADS"], "7");
  }
  ScopedEnv omp("OMP_NUM_THREADS", nullptr);
  auto o = probe(2, {"record=" + dir.path.string()}, out, err);
  o.extra_env = {{"OMP_NUM_THREADS", "5"}};
  ASSERT_EQ(fl::launch(o).exit_code, 0) << err.text();
  EXPECT_EQ(read_record(dir.path, 1)["OMP_NUM_THREADS"], "5");
}

TEST(Launcher, OnASecondNodeRanksAreOffsetByTheNodeRank) {
  TempDir dir;
  Capture out, err;
  ScopedEnv stale("TORCHELASTIC_USE_AGENT_STORE", "True");  // of an outer launch: must not reach the ranks
  auto o = probe(2, {"record=" + dir.path.string()}, out, err);
  o.nnodes = 2;
  o.node_rank = 1;
  o.master_port = fl::pick_free_port("127.0.0.1");
  ASSERT_EQ(fl::launch(o).exit_code, 0) << err.text();
  for (int local = 0; local < 2; ++local) {
    auto env = read_record(dir.path, 2 + local);
    EXPECT_EQ(env["RANK"], std::to_string(2 + local));
    EXPECT_EQ(env["LOCAL_RANK"], std::to_string(local));
    EXPECT_EQ(env["WORLD_SIZE"], "4");
    EXPECT_EQ(env["LOCAL_WORLD_SIZE"], "2");
    EXPECT_EQ(env["GROUP_RANK"], "1");
    EXPECT_EQ(env["GROUP_WORLD_SIZE"], "2");
    EXPECT_EQ(env["MASTER_PORT"], std::to_string(o.master_port));
    EXPECT_EQ(env.count("TORCHELASTIC_USE_AGENT_STORE"), 0u) << "a given port: rank 0 serves the store";
  }
}

// The port the launcher picks stays taken from the moment it is picked until the launch ends: no other process can
// bind it before the ranks meet there (picking a free port and releasing it left that window open).
TEST(Launcher, ThePortItPicksIsHeldForTheWholeLaunchAcrossRestarts) {
  TempDir dir;
  Capture out, err;
  const auto d = dir.path.string();
  auto o = probe(2,
                 {"record=" + d, "wait=" + d + ":2", "r1:bind-master=" + d + "/bind.restart0",
                  "r1:first-attempt-exit=2", "r1:bind-master=" + d + "/bind.restart1"},
                 out, err);
  o.max_restarts = 1;
  const auto result = fl::launch(o);
  ASSERT_EQ(result.exit_code, 0) << result.summary << "\n" << err.text();
  EXPECT_EQ(read_text(dir.path / "bind.restart0"), "in use");
  EXPECT_EQ(read_text(dir.path / "bind.restart1"), "in use");
  EXPECT_EQ(read_record(dir.path, 0, 0)["MASTER_PORT"], read_record(dir.path, 0, 1)["MASTER_PORT"])
      << "one store for the whole launch";
}

TEST(Launcher, PickFreePortTakesAPortBelowTheEphemeralRange) {
  std::ifstream range("/proc/sys/net/ipv4/ip_local_port_range");
  int low = 0;
  ASSERT_TRUE(range >> low);
  for (int i = 0; i < 20; ++i) {
    const int port = fl::pick_free_port("127.0.0.1");
    EXPECT_LT(port, low) << "outside the range that bind() to port 0 and outgoing connections take ports from";
    EXPECT_GE(port, 1024);
  }
  EXPECT_THROW(fl::pick_free_port("no-such-host.invalid"), fl::ConfigError);
}

TEST(Launcher, ProgressIsLiveOnlyForRankZeroWhenOutIsATerminal) {
  const int master = posix_openpt(O_RDWR | O_NOCTTY);
  ASSERT_GE(master, 0);
  ASSERT_EQ(grantpt(master), 0);
  ASSERT_EQ(unlockpt(master), 0);
  std::FILE* terminal = std::fopen(ptsname(master), "w");
  ASSERT_NE(terminal, nullptr);
  TempDir dir;
  Capture out, err;
  auto o = probe(2, {"record=" + dir.path.string()}, out, err);
  o.out = terminal;
  ASSERT_EQ(fl::launch(o).exit_code, 0) << err.text();
  EXPECT_EQ(read_record(dir.path, 0)["FASTLEARN_PROGRESS_LIVE"], "1");
  EXPECT_EQ(read_record(dir.path, 1).count("FASTLEARN_PROGRESS_LIVE"), 0u);
  std::fclose(terminal);
  close(master);
}

// ---- output -------------------------------------------------------------------------------------------

TEST(Launcher, OutputIsPrefixedPerLineAndPartialLinesAreHeld) {
  Capture out, err;
  const auto result = fl::launch(probe(
      2, {"write=first ha", "sleep-ms=150", "write=lf\nsecond\n", "eprint=to stderr", "write=no newline at the end"},
      out, err));
  ASSERT_EQ(result.exit_code, 0) << result.summary;
  const auto text = out.text();
  for (int rank = 0; rank < 2; ++rank) {
    for (const auto* line : {"first half\n", "second\n", "no newline at the end\n"})
      EXPECT_NE(text.find(fmt::format("[rank {}] {}", rank, line)), std::string::npos) << line << "in:\n" << text;
    EXPECT_NE(err.text().find(fmt::format("[rank {}] to stderr\n", rank)), std::string::npos) << err.text();
  }
  std::istringstream lines(text);
  std::string line;
  int count = 0;
  while (std::getline(lines, line)) {
    ++count;
    EXPECT_TRUE(line.starts_with("[rank 0] ") || line.starts_with("[rank 1] ")) << "unprefixed: '" << line << "'";
  }
  EXPECT_EQ(count, 6);
}

TEST(Launcher, CarriageReturnEndsASegmentSoProgressBarsRedraw) {
  Capture out, err;
  const auto result = fl::launch(probe(1,
                                       {"write=10%\r", "sleep-ms=50", "write=20%", "sleep-ms=50", "write=\r30%\n",
                                        "write=crlf\r", "sleep-ms=50", "write=\nend\r\n"},
                                       out, err));
  ASSERT_EQ(result.exit_code, 0) << result.summary;
  EXPECT_EQ(out.text(), "[rank 0] 10%\r[rank 0] 20%\r[rank 0] 30%\n[rank 0] crlf\r\n[rank 0] end\r\n");
}

TEST(Launcher, NoPrefixKeepsTheLinesAsTheyAre) {
  Capture out, err;
  auto o = probe(1, {"print=plain", "eprint=plain err"}, out, err);
  o.prefix_output = false;
  ASSERT_EQ(fl::launch(o).exit_code, 0);
  EXPECT_EQ(out.text(), "plain\n");
  EXPECT_EQ(err.text(), "plain err\n");
}

TEST(Launcher, LogDirHoldsEachRanksOutputPerRestart) {
  TempDir dir;
  Capture out, err;
  auto o = probe(2, {"print=hello", "eprint=oops", "r1:first-attempt-exit=1"}, out, err);
  o.log_dir = dir.path / "logs";
  o.max_restarts = 1;
  const auto result = fl::launch(o);
  ASSERT_EQ(result.exit_code, 0) << result.summary;
  EXPECT_EQ(result.restarts, 1);
  for (const auto& sub : {fs::path(), fs::path("restart_1")}) {
    for (int rank = 0; rank < 2; ++rank) {
      const auto file = dir.path / "logs" / sub / fmt::format("rank{}.log", rank);
      ASSERT_TRUE(fs::exists(file)) << file;
      // In the failed first attempt rank 0 may be stopped (rank 1's failure) before it prints anything.
      if (sub.empty() && rank == 0) continue;
      const auto text = read_text(file);
      EXPECT_NE(text.find("hello\n"), std::string::npos) << file << ": " << text;
      EXPECT_NE(text.find("oops\n"), std::string::npos) << file << ": " << text;
      EXPECT_EQ(text.find("[rank"), std::string::npos) << "log files hold the program's own output";
    }
  }
  EXPECT_FALSE(fs::exists(dir.path / "logs" / "restart_2"));
}

TEST(Launcher, ALogThatCannotBeWrittenIsNamedAndTheOutputGoesOn) {
  TempDir dir;
  Capture out, err;
  auto o = probe(1, {"print=hello", "print=again"}, out, err);
  o.log_dir = dir.path / "logs";
  fs::create_directories(*o.log_dir);
  fs::create_symlink("/dev/full", *o.log_dir / "rank0.log");  // every write fails with ENOSPC
  const auto result = fl::launch(o);
  EXPECT_EQ(result.exit_code, 0) << result.summary;
  EXPECT_NE(err.text().find("fastlearn launch: cannot write rank 0's log '" + (*o.log_dir / "rank0.log").string() +
                            "' (No space left on device): its output goes on to the terminal only"),
            std::string::npos)
      << err.text();
  EXPECT_NE(out.text().find("[rank 0] again\n"), std::string::npos) << out.text();
}

// A shell or service manager may start the launcher with SIGCHLD ignored: the kernel would then reap the ranks and
// every exit would read as "code 255".
TEST(Launcher, ARanksExitCodeIsKeptWhenTheLauncherStartsWithSigchldIgnored) {
  Capture out, err;
  struct sigaction ignore {
  }, previous{};
  ignore.sa_handler = SIG_IGN;
  sigemptyset(&ignore.sa_mask);
  sigaction(SIGCHLD, &ignore, &previous);
  const auto result = fl::launch(probe(1, {"exit=3"}, out, err));
  struct sigaction after {};
  sigaction(SIGCHLD, &previous, &after);
  EXPECT_EQ(after.sa_handler, SIG_IGN) << "the launcher puts SIGCHLD back as it found it";
  EXPECT_EQ(result.exit_code, 3) << result.summary;
  EXPECT_NE(result.summary.find("exited with code 3"), std::string::npos) << result.summary;
}

TEST(Launcher, WithoutCloseRangeEveryDescriptorIsStillMarkedCloseOnExec) {
  // Linux before 5.11 refuses close_range(CLOSE_RANGE_CLOEXEC): the child marks each descriptor instead.
  const int fd = open("/dev/null", O_RDONLY);  // not close-on-exec
  ASSERT_GE(fd, 3);
  ASSERT_EQ(fcntl(fd, F_GETFD) & FD_CLOEXEC, 0);
  fl::detail::mark_cloexec_from(3, fd + 1);
  EXPECT_NE(fcntl(fd, F_GETFD) & FD_CLOEXEC, 0);
  close(fd);
}

// ---- failures -------------------------------------------------------------------------------------------

TEST(Launcher, AFailingRankStopsTheOthersAndIsNamed) {
  TempDir dir;
  Capture out, err;
  const auto d = dir.path.string();
  const auto result = fl::launch(
      probe(3, {"grandchild", "record=" + d, "wait=" + d + ":3", "r1:stamp=" + d + "/failed", "r1:exit=3", "sleep"},
            out, err));
  const double gone_after = seconds_since_stamp(dir.path / "failed");
  EXPECT_EQ(result.exit_code, 3);
  ASSERT_TRUE(result.first_failure);
  EXPECT_EQ(result.first_failure->rank, 1);
  EXPECT_EQ(result.first_failure->exit_code, 3);
  const auto pid1 = read_record(dir.path, 1)["probe.pid"];
  EXPECT_NE(result.summary.find(fmt::format("rank 1 (local 1, pid {}) exited with code 3", pid1)), std::string::npos)
      << result.summary;
  EXPECT_LT(gone_after, 1.0) << "the others die on SIGTERM, before the grace period is over";
  std::printf("[ figure ] rank failure -> all 3 ranks gone and launch() returned: %.1f ms\n", gone_after * 1000);
  expect_all_gone(dir.path, 3);
}

TEST(Launcher, ARankIgnoringSigtermIsKilledAfterTheGracePeriod) {
  TempDir dir;
  Capture out, err;
  const auto d = dir.path.string();
  const auto result = fl::launch(probe(
      2, {"r0:ignore-sigterm", "record=" + d, "wait=" + d + ":2", "r1:stamp=" + d + "/failed", "r1:exit=3", "sleep"},
      out, err));
  const double gone_after = seconds_since_stamp(dir.path / "failed");
  EXPECT_EQ(result.exit_code, 3);
  EXPECT_NE(result.summary.find("killed: rank 0"), std::string::npos) << result.summary;
  EXPECT_GE(gone_after, 1.0);
  EXPECT_LT(gone_after, 1.0 + 1.0) << "SIGKILL right after the grace period";
  std::printf("[ figure ] rank failure -> SIGTERM-ignoring rank SIGKILLed, grace 1000 ms: %.1f ms\n",
              gone_after * 1000);
  expect_all_gone(dir.path, 2);
}

TEST(Launcher, AStoppedRankIsNamedAndSoIsItsGoingOn) {
  Capture out, err;
  const auto result = fl::launch(probe(2, {"r1:stop-for-ms=2500", "sleep-ms=1500", "exit=0"}, out, err));
  EXPECT_EQ(result.exit_code, 0);
  const auto said = err.text();
  EXPECT_NE(said.find("fastlearn launch: rank 1 (local 1, pid "), std::string::npos) << said;
  EXPECT_NE(said.find(") is stopped (SIGSTOP or SIGTSTP): the other ranks wait for it"), std::string::npos) << said;
  EXPECT_NE(said.find("`kill -CONT "), std::string::npos) << said;
  EXPECT_NE(said.find(") goes on\n"), std::string::npos) << said;
  EXPECT_EQ(said.find("rank 0 (local 0"), std::string::npos) << said;
}

TEST(Launcher, ARankKilledByASignalIsNamedWithTheSignal) {
  TempDir dir;
  Capture out, err;
  const auto d = dir.path.string();
  const auto result = fl::launch(probe(2, {"record=" + d, "wait=" + d + ":2", "r0:sigkill", "sleep"}, out, err));
  EXPECT_EQ(result.exit_code, 128 + SIGKILL);
  ASSERT_TRUE(result.first_failure);
  EXPECT_EQ(result.first_failure->rank, 0);
  EXPECT_EQ(result.first_failure->signal, SIGKILL);
  EXPECT_NE(result.summary.find("rank 0 (local 0, pid "), std::string::npos) << result.summary;
  EXPECT_NE(result.summary.find("was killed by signal 9 (SIGKILL)"), std::string::npos) << result.summary;
  expect_all_gone(dir.path, 2);
}

TEST(Launcher, MaxRestartsRestartsTheGroupAfterAFailure) {
  TempDir dir;
  Capture out, err;
  const auto d = dir.path.string();
  auto o = probe(2, {"record=" + d, "wait=" + d + ":2", "r1:first-attempt-exit=2"}, out, err);
  o.max_restarts = 1;
  const auto result = fl::launch(o);
  EXPECT_EQ(result.exit_code, 0) << result.summary;
  EXPECT_EQ(result.restarts, 1);
  EXPECT_FALSE(result.first_failure);
  EXPECT_NE(err.text().find("rank 1 (local 1, pid"), std::string::npos) << err.text();
  for (int restart = 0; restart < 2; ++restart) {
    for (int rank = 0; rank < 2; ++rank) {
      auto env = read_record(dir.path, rank, restart);
      EXPECT_EQ(env["TORCHELASTIC_RESTART_COUNT"], std::to_string(restart)) << "rank " << rank;
      EXPECT_EQ(env["TORCHELASTIC_MAX_RESTARTS"], "1");
    }
  }
  EXPECT_NE(read_record(dir.path, 0, 0)["probe.pid"], read_record(dir.path, 0, 1)["probe.pid"]) << "new processes";
}

TEST(Launcher, MaxRestartsGivesUpWhenEveryAttemptFails) {
  TempDir dir;
  Capture out, err;
  const auto d = dir.path.string();
  auto o = probe(2, {"record=" + d, "wait=" + d + ":2", "r1:exit=2", "sleep"}, out, err);
  o.max_restarts = 1;
  const auto result = fl::launch(o);
  EXPECT_EQ(result.exit_code, 2);
  EXPECT_EQ(result.restarts, 1);
  ASSERT_TRUE(result.first_failure);
  EXPECT_EQ(result.first_failure->rank, 1);
  EXPECT_NE(result.summary.find("gave up after max_restarts = 1"), std::string::npos) << result.summary;
  EXPECT_FALSE(read_record(dir.path, 0, 1).empty());
  EXPECT_TRUE(read_record(dir.path, 0, 2).empty()) << "only one restart";
  expect_all_gone(dir.path, 2, 0);
  expect_all_gone(dir.path, 2, 1);
}

TEST(Launcher, BadOptionsAreConfigErrorsThatSayWhatToDo) {
  Capture out, err;
  auto expect_error = [&](const std::function<void(fl::LaunchOptions&)>& change, const std::string& needle) {
    auto o = probe(1, {}, out, err);
    change(o);
    try {
      fl::launch(o);
      ADD_FAILURE() << "no error; expected one with '" << needle << "'";
    } catch (const fl::ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  expect_error([](auto& o) { o.nproc_per_node = 0; }, "nproc_per_node is 0; it must be at least 1");
  expect_error(
      [](auto& o) {
        o.node_rank = 2;
        o.nnodes = 2;
        o.master_port = 29500;
      },
      "node_rank is 2 but nnodes is 2; node_rank must be in [0, 1]");
  expect_error([](auto& o) { o.nnodes = 2; }, "with 2 nodes pass the same explicit master_port");
  expect_error([](auto& o) { o.command.clear(); }, "the command is empty");
  expect_error([](auto& o) { o.command = {"/no/such/program"}; }, "program '/no/such/program' does not exist");
  expect_error([](auto& o) { o.command = {"no-such-program-fastlearn"}; },
               "program 'no-such-program-fastlearn' was not found in PATH");
  expect_error([](auto& o) { o.command = {std::string(FASTLEARN_SOURCE_DIR) + "/CMakeLists.txt"}; },
               "is not an executable file");
  expect_error([](auto& o) { o.max_restarts = -1; }, "max_restarts is -1");
  expect_error([](auto& o) { o.master_port = 70000; }, "master_port 70000 is not a TCP port");
  expect_error([](auto& o) { o.extra_env = {{"RANK", "3"}}; }, "extra_env sets RANK");
  expect_error([](auto& o) { o.master_addr = "no-such-host.invalid"; },
               "cannot serve the rendezvous store on master_addr 'no-such-host.invalid' (cannot resolve");
  EXPECT_EQ(out.text(), "") << "nothing was started";
}

TEST(Launcher, ACommandFoundInPathRuns) {
  Capture out, err;
  fl::LaunchOptions o;
  o.command = {"sh", "-c", "echo $RANK/$WORLD_SIZE"};
  o.nproc_per_node = 2;
  o.out = out.file;
  o.err = err.file;
  ASSERT_EQ(fl::launch(o).exit_code, 0) << err.text();
  EXPECT_NE(out.text().find("[rank 1] 1/2\n"), std::string::npos) << out.text();
}

TEST(Launcher, AProgramThatCannotBeExecutedIsNamedWithTheReason) {
  TempDir dir;
  const auto script = dir.path / "no_shebang";
  std::ofstream(script) << "echo hi\n";  // executable, but no #! line: execve refuses it
  fs::permissions(script, fs::perms::owner_all);
  Capture out, err;
  fl::LaunchOptions o;
  o.command = {script.string()};
  o.out = out.file;
  o.err = err.file;
  EXPECT_EQ(fl::launch(o).exit_code, 127);
  EXPECT_NE(err.text().find("execve() of the rank's program '" + script.string() + "' failed: Exec format error"),
            std::string::npos)
      << err.text();
}

// ---- the `fastlearn launch` command ----------------------------------------------------------------------

struct Cli {
  int pid = 0;
  TempDir dir;
  fs::path out() const { return dir.path / "stdout"; }
  fs::path err() const { return dir.path / "stderr"; }

  explicit Cli(const std::vector<std::string>& args, const std::string& program = FASTLEARN_CLI) {
    std::vector<std::string> all{program};
    all.insert(all.end(), args.begin(), args.end());
    std::vector<char*> argv;
    for (auto& a : all) argv.push_back(a.data());
    argv.push_back(nullptr);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, 1, out().c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    posix_spawn_file_actions_addopen(&actions, 2, err().c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    posix_spawnattr_t attr;
    posix_spawnattr_init(&attr);
    sigset_t defaults;
    sigemptyset(&defaults);
    sigaddset(&defaults, SIGINT);
    sigaddset(&defaults, SIGTERM);
    posix_spawnattr_setsigdefault(&attr, &defaults);  // even if the test runs as a background job
    posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGDEF);
    EXPECT_EQ(posix_spawn(&pid, argv[0], &actions, &attr, argv.data(), environ), 0);
    posix_spawn_file_actions_destroy(&actions);
    posix_spawnattr_destroy(&attr);
  }
  int wait_exit_code() {
    int status = 0;
    waitpid(pid, &status, 0);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }
};

void wait_for_records(const fs::path& dir, int n) {
  const auto until = Clock::now() + std::chrono::seconds(20);
  for (;;) {
    int found = 0;
    for (int rank = 0; rank < n; ++rank) found += fs::exists(dir / fmt::format("rank{}.restart0", rank));
    if (found == n || Clock::now() > until) return;
    std::this_thread::sleep_for(milliseconds(5));
  }
}

void expect_forwarded_signal_ends_all(int sig) {
  TempDir ranks;
  Cli cli({"launch", "--nproc-per-node", "2", "--grace-period", "1", "--", FASTLEARN_LAUNCH_PROBE, "grandchild",
           "record=" + ranks.path.string(), "sleep"});
  wait_for_records(ranks.path, 2);
  std::vector<int> pids;
  for (int rank = 0; rank < 2; ++rank) pids.push_back(std::stoi(read_record(ranks.path, rank)["probe.pid"]));
  const auto start = Clock::now();
  kill(cli.pid, sig);
  while (std::any_of(pids.begin(), pids.end(), alive) && Clock::now() - start < std::chrono::seconds(5))
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  const double ranks_ms = std::chrono::duration<double, std::milli>(Clock::now() - start).count();
  EXPECT_EQ(cli.wait_exit_code(), 128 + sig) << read_text(cli.err());
  const double exit_ms = std::chrono::duration<double, std::milli>(Clock::now() - start).count();
  std::printf("[ figure ] %s to `fastlearn launch` -> 2 ranks dead: %.1f ms, launcher exited: %.1f ms\n",
              fl::signal_name(sig).c_str(), ranks_ms, exit_ms);
  EXPECT_NE(read_text(cli.err()).find("interrupted by " + fl::signal_name(sig)), std::string::npos)
      << read_text(cli.err());
  expect_all_gone(ranks.path, 2);
}

TEST(LaunchCli, SigintStopsAllRanksAndExitsWith130) { expect_forwarded_signal_ends_all(SIGINT); }

TEST(LaunchCli, SigtermStopsAllRanksAndExitsWith143) { expect_forwarded_signal_ends_all(SIGTERM); }

TEST(LaunchCli, AKilledLauncherTakesItsRanksWithIt) {
  TempDir ranks;
  Cli cli({"launch", "--nproc-per-node", "2", "--", FASTLEARN_LAUNCH_PROBE, "record=" + ranks.path.string(), "sleep"});
  wait_for_records(ranks.path, 2);
  kill(cli.pid, SIGKILL);  // no chance to stop anything: PR_SET_PDEATHSIG does it
  EXPECT_EQ(cli.wait_exit_code(), 128 + SIGKILL);
  expect_all_gone(ranks.path, 2);
}

TEST(LaunchCli, AFailingRankSetsTheExitCodeAndTheSummaryGoesToStderr) {
  Cli cli({"launch", "--nproc-per-node", "2", "--grace-period", "1", "--", FASTLEARN_LAUNCH_PROBE, "print=hi",
           "r1:exit=5", "sleep"});
  EXPECT_EQ(cli.wait_exit_code(), 5);
  // Rank 1 prints, then fails; rank 0 may be stopped before it prints, so only rank 1's line is certain.
  EXPECT_NE(read_text(cli.out()).find("[rank 1] hi\n"), std::string::npos) << read_text(cli.out());
  const auto err = read_text(cli.err());
  EXPECT_NE(err.find("fastlearn launch: rank 1 (local 1, pid "), std::string::npos) << err;
  EXPECT_NE(err.find(") exited with code 5"), std::string::npos) << err;
}

// Started with stdin and stdout closed (as by a careless daemon), the launcher's first pipe would take descriptor 0 or
// 1: its own output would then go into its signal pipe (read back as signals) or fail, and a rank's pipe end there
// would not survive the rank's exec. They are held by /dev/null instead, and the ranks' output reaches the log.
TEST(LaunchCli, ClosedStandardDescriptorsAreHeldByDevNullNotByThePipes) {
  TempDir dir;
  const auto [code, output] = fl::testing::run_shell(
      fmt::format("sh -c \"exec <&- >&- 2>'{}' '{}' launch --log-dir '{}' -- '{}' launcher-fds='{}' print=through\"",
                  (dir.path / "err").string(), FASTLEARN_CLI, (dir.path / "logs").string(), FASTLEARN_LAUNCH_PROBE,
                  (dir.path / "fds").string()));
  EXPECT_EQ(code, 0) << output << read_text(dir.path / "err");
  EXPECT_EQ(read_text(dir.path / "fds"), "/dev/null\n/dev/null\n" + (dir.path / "err").string() + "\n")
      << "the launcher's descriptors 0, 1 and 2";
  EXPECT_EQ(read_text(dir.path / "logs" / "rank0.log"), "through\n") << read_text(dir.path / "err");
}

TEST(LaunchCli, ProgramArgumentsThatLookLikeOptionsReachTheProgram) {
  Cli cli({"launch", "--no-prefix", "--", FASTLEARN_LAUNCH_PROBE, "print=--nproc-per-node"});
  EXPECT_EQ(cli.wait_exit_code(), 0) << read_text(cli.err());
  EXPECT_EQ(read_text(cli.out()), "--nproc-per-node\n");
}

// `fastlearn` runs the launch without LibTorch (its start-up would delay every rank by a second or two); the ranks
// meet on the store rank 0 serves (the example apps' tests train through it).
TEST(LaunchCli, TheLauncherLoadsNoLibTorch) {
  Cli cli({"launch", "--nproc-per-node", "2", "--no-prefix", "--", "/bin/sh", "-c",
           "echo libtorch in the launcher: $(grep -c libtorch /proc/$PPID/maps)"});
  EXPECT_EQ(cli.wait_exit_code(), 0) << read_text(cli.err());
  EXPECT_EQ(read_text(cli.out()), "libtorch in the launcher: 0\nlibtorch in the launcher: 0\n");
}

TEST(LaunchCli, AMissingHelperProgramIsNamed) {
  TempDir dir;
  const auto cli = dir.path / "fastlearn";  // a copy of `fastlearn` alone in a folder
  fs::copy_file(FASTLEARN_CLI, cli);
  Cli version({"--version"}, cli);
  EXPECT_EQ(version.wait_exit_code(), 127);
  EXPECT_NE(read_text(version.err()).find("cannot find fastlearn-torch beside"), std::string::npos)
      << read_text(version.err());
}

// Rank 0 serves the rendezvous store on the socket the launcher holds (no store process beside the ranks): it gets
// the listening socket as descriptor 3 and FASTLEARN_STORE_FD=3, the other ranks neither, and no rank is told to use
// an agent's store. Its restart serves on the same socket.
TEST(LaunchCli, RankZeroServesTheStoreOnTheLaunchersSocket) {
  TempDir ranks;
  Cli cli({"launch", "--nproc-per-node", "2", "--max-restarts", "1", "--", FASTLEARN_LAUNCH_PROBE,
           "record=" + ranks.path.string(), "wait=" + ranks.path.string() + ":2", "r1:first-attempt-exit=4"});
  EXPECT_EQ(cli.wait_exit_code(), 0) << read_text(cli.err());
  for (int restart : {0, 1}) {
    auto zero = read_record(ranks.path, 0, restart), one = read_record(ranks.path, 1, restart);
    EXPECT_EQ(zero["FASTLEARN_STORE_FD"], "3") << "restart " << restart;
    EXPECT_FALSE(one.count("FASTLEARN_STORE_FD")) << "restart " << restart;
    EXPECT_FALSE(zero.count("TORCHELASTIC_USE_AGENT_STORE")) << "restart " << restart;
    EXPECT_EQ(zero["MASTER_PORT"], read_record(ranks.path, 0, 0)["MASTER_PORT"]) << "one port for the launch";
  }
}

TEST(LaunchCli, HelpDescribesEveryOption) {
  Cli cli({"launch", "--help"});
  EXPECT_EQ(cli.wait_exit_code(), 0);
  const auto help = read_text(cli.out());
  for (const auto* option : {"--nproc-per-node", "--nnodes", "--node-rank", "--master-addr", "--master-port",
                             "--max-restarts", "--log-dir", "--grace-period", "--no-prefix"})
    EXPECT_NE(help.find(option), std::string::npos) << option << " missing in:\n" << help;
}

TEST(LaunchCli, BadOptionsAreClearErrors) {
  Cli cli({"launch", "--nnodes", "2", "--node-rank", "3", "--master-port", "29500", "--", FASTLEARN_LAUNCH_PROBE});
  EXPECT_NE(cli.wait_exit_code(), 0);
  EXPECT_NE(read_text(cli.err()).find("node_rank is 3 but nnodes is 2"), std::string::npos) << read_text(cli.err());
  Cli none({"launch"});
  EXPECT_NE(none.wait_exit_code(), 0);
  EXPECT_NE(read_text(none.err()).find("no program given"), std::string::npos) << read_text(none.err());
}

// Users coming from torchrun type its spellings: the underscore forms and --standalone work, --no-python is
// accepted, and a torchrun flag without a counterpart is named with the nearest option and what to do.
TEST(LaunchCli, TorchrunSpellingsWork) {
  TempDir ranks;
  Cli cli({"launch", "--standalone", "--nproc_per_node=2", "--max_restarts", "0", "--no-python", "--rdzv_id", "job7",
           "--no-prefix", "--", FASTLEARN_LAUNCH_PROBE, "record=" + ranks.path.string()});
  EXPECT_EQ(cli.wait_exit_code(), 0) << read_text(cli.err());
  for (int rank = 0; rank < 2; ++rank) {
    auto env = read_record(ranks.path, rank);
    EXPECT_EQ(env["WORLD_SIZE"], "2");
    EXPECT_EQ(env["MASTER_ADDR"], "127.0.0.1");
  }
}

TEST(LaunchCli, AnUnknownTorchrunFlagIsNamedWithTheNearestOption) {
  Cli cli({"launch", "--nproc-per-node", "2", "--rdzv-backend=c10d", "--", FASTLEARN_LAUNCH_PROBE});
  EXPECT_NE(cli.wait_exit_code(), 0);
  const auto err = read_text(cli.err());
  EXPECT_NE(err.find("unknown option '--rdzv-backend=c10d' (a torchrun option: fastlearn launch meets the other nodes "
                     "through --master-addr / --master-port"),
            std::string::npos)
      << err;
  EXPECT_NE(err.find("the nearest option of fastlearn launch is --rdzv-id"), std::string::npos) << err;
  Cli typo({"launch", "--nproc-per-nod", "2", "--", FASTLEARN_LAUNCH_PROBE});
  EXPECT_NE(typo.wait_exit_code(), 0);
  EXPECT_NE(read_text(typo.err()).find("the nearest option of fastlearn launch is --nproc-per-node"), std::string::npos)
      << read_text(typo.err());
}

// ---- spawn() ----------------------------------------------------------------------------------------------

// The same folder in the test process and in its spawned children (whose parent it is).
fs::path shared_dir() {
  const int root = fl::in_spawned_process() ? getppid() : getpid();
  auto dir = fs::temp_directory_path() / fmt::format("fastlearn-spawn-test-{}-{}", root, current_test());
  fs::create_directories(dir);
  return dir;
}

fl::SpawnOptions spawn_options(const Capture& out, const Capture& err) {
  return {.extra_args = {"--gtest_filter=" + current_test()}, .grace_period = kGrace, .out = out.file, .err = err.file};
}

TEST(Spawn, EachOfThreeRanksRunsTheFunction) {
  const auto dir = shared_dir();
  Capture out, err;
  fl::spawn(
      3,
      [&](int rank) {
        std::ofstream(dir / fmt::format("rank{}", rank)) << rank << " " << std::getenv("WORLD_SIZE") << " " << getpid();
        std::printf("hello from %d\n", rank);
      },
      spawn_options(out, err));
  std::set<std::string> pids;
  for (int rank = 0; rank < 3; ++rank) {
    std::istringstream in(read_text(dir / fmt::format("rank{}", rank)));
    int r = -1, world = -1;
    std::string pid;
    in >> r >> world >> pid;
    EXPECT_EQ(r, rank);
    EXPECT_EQ(world, 3);
    EXPECT_NE(pid, std::to_string(getpid()));
    pids.insert(pid);
    EXPECT_NE(out.text().find(fmt::format("[rank {}] hello from {}\n", rank, rank)), std::string::npos) << out.text();
  }
  EXPECT_EQ(pids.size(), 3u);
  fs::remove_all(dir);
}

TEST(Spawn, AFailingRankIsADistributedErrorWithItsMessage) {
  Capture out, err;
  const auto start = Clock::now();
  try {
    fl::spawn(
        3,
        [](int rank) {
          if (rank == 1) throw std::runtime_error("the data of rank 1 is broken");
          pause();  // the others wait, as if in a collective, until they are stopped
        },
        spawn_options(out, err));
    ADD_FAILURE() << "spawn() returned";
  } catch (const fl::DistributedError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("rank 1 raised std::runtime_error: the data of rank 1 is broken"), std::string::npos) << what;
    EXPECT_NE(what.find("the other ranks were stopped"), std::string::npos) << what;
  }
  // The others pause() for ever unless stopped; 30 s leaves room for a slow machine starting 3 ranks
  // (5.4 s on a loaded 2-core VM) and still fails well before the test's 60 s timeout.
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(30));
}

TEST(Spawn, ARankKilledByASignalIsNamed) {
  Capture out, err;
  try {
    fl::spawn(
        2,
        [](int rank) {
          if (rank == 0) raise(SIGKILL);
        },
        spawn_options(out, err));
    ADD_FAILURE() << "spawn() returned";
  } catch (const fl::DistributedError& e) {
    EXPECT_NE(std::string(e.what()).find("rank 0 (local 0, pid "), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("killed by signal 9 (SIGKILL)"), std::string::npos) << e.what();
  }
}

TEST(Spawn, ChildrenThatNeverReachSpawnAreAnError) {
  Capture out, err;
  auto options = spawn_options(out, err);
  options.extra_args = {"--gtest_filter=NoSuchSuite.NoSuchTest"};
  try {
    fl::spawn(
        2, [](int) {}, options);
    ADD_FAILURE() << "spawn() returned";
  } catch (const fl::DistributedError& e) {
    EXPECT_NE(std::string(e.what()).find("did not reach the matching spawn() call"), std::string::npos) << e.what();
  }
}

TEST(Spawn, TwoCallsInOneTestEachRunTheirOwnFunction) {
  const auto dir = shared_dir();
  Capture out, err;
  fl::spawn(
      2, [&](int rank) { std::ofstream(dir / fmt::format("first{}", rank)) << "x"; }, spawn_options(out, err));
  fl::spawn(
      2, [&](int rank) { std::ofstream(dir / fmt::format("second{}", rank)) << "x"; }, spawn_options(out, err));
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_TRUE(fs::exists(dir / fmt::format("first{}", rank)));
    EXPECT_TRUE(fs::exists(dir / fmt::format("second{}", rank)));
  }
  fs::remove_all(dir);
}

TEST(Spawn, NprocsBelowOneIsAConfigError) {
  EXPECT_THROW(fl::spawn(0, [](int) {}), fl::ConfigError);
}

}  // namespace
