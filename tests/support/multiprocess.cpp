#include "support/multiprocess.h"

#include <fastlearn/launch/launcher.h>
#include <cstdio>

#include <arpa/inet.h>
#include <fmt/format.h>
#include <gtest/gtest-spi.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <spawn.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <fcntl.h>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <sstream>
#include <thread>

extern char** environ;

namespace fastlearn::testing {
namespace {

using Clock = std::chrono::steady_clock;

constexpr const char* kRankVar = "FASTLEARN_MP_RANK";
constexpr const char* kWorldVar = "FASTLEARN_MP_WORLD_SIZE";
constexpr const char* kPortVar = "FASTLEARN_MP_STORE_PORT";
constexpr const char* kCallVar = "FASTLEARN_MP_CALL";
constexpr const char* kParentVar = "FASTLEARN_MP_PARENT";
constexpr int kSkipExitCode = 77;
// Once a rank has failed, the others usually wait in a collective: give them this long, then kill them.
constexpr auto kFailFastGrace = std::chrono::seconds(10);

std::string current_test_name() {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  return info ? fmt::format("{}.{}", info->test_suite_name(), info->name()) : std::string();
}

// Index of this run_ranks call within the running test, so a child runs only its own call's body.
int next_call_index() {
  static std::string test;
  static int index = 0;
  const auto name = current_test_name();
  if (name != test) {
    test = name;
    index = 0;
  }
  return index++;
}

std::optional<int> env_int(const char* name) {
  const char* value = std::getenv(name);
  if (!value) return std::nullopt;
  return std::atoi(value);
}

// ---- child side -------------------------------------------------------------------------------------

[[noreturn]] void run_child(const std::function<void(const RankContext&)>& body) {
  // Die with the parent (a killed test must not leave ranks behind).
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != env_int(kParentVar).value_or(-1)) _exit(1);

  RankContext context;
  context.rank = *env_int(kRankVar);
  context.world_size = *env_int(kWorldVar);
  ::testing::TestPartResultArray results;
  {
    ::testing::ScopedFakeTestPartResultReporter reporter(
        ::testing::ScopedFakeTestPartResultReporter::INTERCEPT_ALL_THREADS, &results);
    try {
      c10d::TCPStoreOptions store_options;
      store_options.port = static_cast<std::uint16_t>(*env_int(kPortVar));
      store_options.isServer = false;
      store_options.timeout = std::chrono::seconds(30);
      context.store = c10::make_intrusive<c10d::TCPStore>("127.0.0.1", store_options);
      body(context);
    } catch (const std::exception& e) {
      ADD_FAILURE() << "rank " << context.rank << " threw: " << e.what();
    } catch (...) {
      ADD_FAILURE() << "rank " << context.rank << " threw a non-standard exception";
    }
  }
  bool failed = false;
  bool skipped = false;
  for (int i = 0; i < results.size(); ++i) {
    const auto& r = results.GetTestPartResult(i);
    failed |= r.failed();
    skipped |= r.skipped();
    std::cerr << (r.file_name() ? r.file_name() : "?") << ":" << r.line_number() << ": "
              << (r.failed()    ? "Failure"
                  : r.skipped() ? "Skipped"
                                : "Note")
              << "\n"
              << r.message() << "\n";
  }
  std::cout.flush();
  std::cerr.flush();
  std::fflush(nullptr);
  // _exit: skip static destructors and the rest of the test, which belong to the parent.
  _exit(failed ? 1 : skipped ? kSkipExitCode : 0);
}

// ---- parent side ------------------------------------------------------------------------------------

bool is_reserved_variable(std::string_view entry) {
  // The child runs exactly one test and must not shard it away or overwrite the parent's report.
  for (std::string_view prefix : {"GTEST_TOTAL_SHARDS=", "GTEST_SHARD_INDEX=", "GTEST_SHARD_STATUS_FILE=",
                                  "GTEST_OUTPUT=", "GTEST_FILTER=", "FASTLEARN_MP_"}) {
    if (entry.starts_with(prefix)) return true;
  }
  return false;
}

struct Child {
  RankResult result;
  std::filesystem::path output_file;
  bool running = false;
};

void record_exit(Child& child, int status) {
  child.running = false;
  if (WIFEXITED(status)) {
    child.result.exit_code = WEXITSTATUS(status);
    child.result.passed = child.result.exit_code == 0;
    child.result.skipped = child.result.exit_code == kSkipExitCode;
  } else if (WIFSIGNALED(status)) {
    child.result.signal = WTERMSIG(status);
  }
}

void spawn_child(Child& child, int world_size, int port, int call, const MultiProcessOptions& options) {
  std::string pattern = (std::filesystem::temp_directory_path() / "fastlearn-rank-XXXXXX").string();
  const int fd = mkstemp(pattern.data());
  if (fd < 0) throw std::runtime_error(fmt::format("mkstemp failed: {}", std::strerror(errno)));
  close(fd);
  child.output_file = pattern;

  std::vector<std::string> env;
  for (char** e = environ; *e; ++e)
    if (!is_reserved_variable(*e)) env.emplace_back(*e);
  const int rank = child.result.rank;
  env.push_back(fmt::format("{}={}", kRankVar, rank));
  env.push_back(fmt::format("{}={}", kWorldVar, world_size));
  env.push_back(fmt::format("{}={}", kPortVar, port));
  env.push_back(fmt::format("{}={}", kCallVar, call));
  env.push_back(fmt::format("{}={}", kParentVar, getpid()));
  if (options.env)
    for (const auto& [key, value] : options.env(rank)) env.push_back(fmt::format("{}={}", key, value));

  std::vector<std::string> args{"/proc/self/exe", "--gtest_filter=" + current_test_name(), "--gtest_color=no",
                                "--gtest_also_run_disabled_tests"};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::vector<char*> envp;
  for (auto& e : env) envp.push_back(e.data());
  envp.push_back(nullptr);

  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&actions, 1, child.output_file.c_str(), O_WRONLY | O_TRUNC, 0600);
  posix_spawn_file_actions_adddup2(&actions, 1, 2);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP);  // own process group: killed as a whole
  posix_spawnattr_setpgroup(&attr, 0);
  pid_t pid = 0;
  const int rc = posix_spawn(&pid, argv[0], &actions, &attr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attr);
  if (rc != 0) throw std::runtime_error(fmt::format("posix_spawn of rank {} failed: {}", rank, std::strerror(rc)));
  child.result.pid = pid;
  child.running = true;
}

std::string read_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

}  // namespace

int free_tcp_port() { return fastlearn::pick_free_port("127.0.0.1"); }

std::function<std::map<std::string, std::string>(int rank)> torchrun_env(int world_size) {
  // The port is picked when the parent starts the ranks (the lambda runs only there), not when the test
  // body runs in a child.
  auto port = std::make_shared<int>(0);
  return [port, world_size](int rank) {
    if (*port == 0) *port = free_tcp_port();
    return std::map<std::string, std::string>{
        {"RANK", std::to_string(rank)},       {"WORLD_SIZE", std::to_string(world_size)},
        {"LOCAL_RANK", std::to_string(rank)}, {"LOCAL_WORLD_SIZE", std::to_string(world_size)},
        {"MASTER_ADDR", "127.0.0.1"},         {"MASTER_PORT", std::to_string(*port)}};
  };
}

bool in_rank_process() { return std::getenv(kRankVar) != nullptr; }

int test_process_id() { return in_rank_process() ? env_int(kParentVar).value_or(getpid()) : getpid(); }

std::string RankResult::summary() const {
  if (timed_out) return fmt::format("rank {}: timed out (killed)", rank);
  if (stopped_after_failure) return fmt::format("rank {}: killed because another rank failed first", rank);
  if (signal != 0) return fmt::format("rank {}: killed by signal {} ({})", rank, signal, strsignal(signal));
  if (skipped) return fmt::format("rank {}: skipped", rank);
  if (passed) return fmt::format("rank {}: passed", rank);
  return fmt::format("rank {}: exited with code {}", rank, exit_code);
}

std::vector<RankResult> run_ranks(int world_size, const std::function<void(const RankContext&)>& body,
                                  const MultiProcessOptions& options) {
  const int call = next_call_index();
  if (in_rank_process()) {
    if (env_int(kCallVar) == call) run_child(body);
    // Another call of this test: the parent runs it; report it as passed here.
    std::vector<RankResult> placeholder(world_size);
    for (int r = 0; r < world_size; ++r) {
      placeholder[r].rank = r;
      placeholder[r].passed = true;
    }
    return placeholder;
  }

  // Orphans of a rank (its own children) are reparented to us, so we can reap them.
  prctl(PR_SET_CHILD_SUBREAPER, 1);
  c10d::TCPStoreOptions store_options;
  store_options.port = 0;  // the OS picks a free port
  store_options.isServer = true;
  store_options.waitWorkers = false;
  store_options.timeout = std::chrono::duration_cast<std::chrono::milliseconds>(options.timeout);
  auto store = c10::make_intrusive<c10d::TCPStore>("127.0.0.1", store_options);
  const int port = store->getPort();

  std::vector<Child> children(world_size);
  for (int r = 0; r < world_size; ++r) {
    children[r].result.rank = r;
    spawn_child(children[r], world_size, port, call, options);
  }

  const auto deadline = Clock::now() + options.timeout;
  std::optional<Clock::time_point> fail_deadline;
  for (;;) {
    bool any_running = false;
    for (auto& child : children) {
      if (!child.running) continue;
      int status = 0;
      if (waitpid(child.result.pid, &status, WNOHANG) == child.result.pid) {
        record_exit(child, status);
        if (!child.result.passed && !child.result.skipped && !fail_deadline)
          fail_deadline = Clock::now() + kFailFastGrace;
      }
      any_running |= child.running;
    }
    if (!any_running) break;
    const auto now = Clock::now();
    if (now >= deadline || (fail_deadline && now >= *fail_deadline)) {
      for (auto& child : children) {
        if (!child.running) continue;
        kill(-child.result.pid, SIGKILL);
        int status = 0;
        waitpid(child.result.pid, &status, 0);
        record_exit(child, status);
        child.result.timed_out = now >= deadline;
        child.result.stopped_after_failure = !child.result.timed_out;
      }
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }

  std::vector<RankResult> results;
  for (auto& child : children) {
    // Anything a rank left behind in its process group dies too; as subreaper we reap the orphans.
    kill(-child.result.pid, SIGKILL);
    while (waitpid(-child.result.pid, nullptr, 0) > 0) {}
    child.result.output = read_file(child.output_file);
    std::filesystem::remove(child.output_file);
    results.push_back(std::move(child.result));
  }
  return results;
}

void run_on_ranks(int world_size, const std::function<void(const RankContext&)>& body,
                  const MultiProcessOptions& options) {
  const auto results = run_ranks(world_size, body, options);
  bool all_skipped = !results.empty();
  for (const auto& r : results) all_skipped &= r.skipped;
  if (all_skipped) GTEST_SKIP() << "every rank skipped:\n" << results.front().output;
  for (const auto& r : results) {
    if (options.show_output && r.passed && r.rank == 0) std::printf("--- output of rank 0 ---\n%s", r.output.c_str());
    if (r.passed || r.skipped) continue;
    constexpr std::size_t kTail = 6000;
    const auto& out = r.output;
    ADD_FAILURE() << r.summary() << " (of " << world_size << ")\n--- output of rank " << r.rank << " ---\n"
                  << (out.size() > kTail ? "[...]\n" + out.substr(out.size() - kTail) : out);
  }
}

}  // namespace fastlearn::testing
