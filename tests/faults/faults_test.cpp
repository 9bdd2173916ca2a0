// Faults end to end, through processes: a rank SIGKILLed at a random moment, SIGKILLs while checkpoints are
// written, an elastic restart that resumes, SIGTERM during training, a hung rank, and bad input to the
// fashion_mnist app and `fastlearn launch` (exit code, message on stderr, nothing half-written). The
// training program is tests/faults/fault_probe.cpp: a tiny model on synthetic data, milliseconds per epoch.
#include <archive.h>
#include <archive_entry.h>
#include <arpa/inet.h>
#include <fastlearn/callbacks/checkpointing.h>
#include <fastlearn/core/error.h>
#include <fastlearn/core/safetensors.h>
#include <fastlearn/learner/checkpoint.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "support/build_paths.h"

extern char** environ;

namespace {

namespace fl = fastlearn;
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

constexpr int kGraceSeconds = 1;

struct TempDir {
  fs::path path;
  TempDir() {
    std::string pattern = (fs::temp_directory_path() / "fastlearn-faults-XXXXXX").string();
    path = mkdtemp(pattern.data());
  }
  ~TempDir() { fs::remove_all(path); }
};

std::string read_text(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// A child process with its stdout and stderr in files and extra environment variables.
struct Proc {
  pid_t pid = 0;
  fs::path out, err;
  int status = -1;

  Proc(std::vector<std::string> args, const fs::path& logs, const std::map<std::string, std::string>& env = {},
       const std::string& tag = "proc")
      : out(logs / (tag + ".out")), err(logs / (tag + ".err")) {
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    std::vector<std::string> vars;
    for (char** e = environ; *e; ++e) {
      const std::string var = *e;
      if (!env.contains(var.substr(0, var.find('=')))) vars.push_back(var);
    }
    for (const auto& [k, v] : env) vars.push_back(k + "=" + v);
    std::vector<char*> envp;
    for (auto& v : vars) envp.push_back(v.data());
    envp.push_back(nullptr);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, 1, out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    posix_spawn_file_actions_addopen(&actions, 2, err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    posix_spawnattr_t attr;
    posix_spawnattr_init(&attr);
    sigset_t defaults;
    sigemptyset(&defaults);
    sigaddset(&defaults, SIGINT);
    sigaddset(&defaults, SIGTERM);
    posix_spawnattr_setsigdefault(&attr, &defaults);
    posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGDEF);
    EXPECT_EQ(posix_spawn(&pid, argv[0], &actions, &attr, argv.data(), envp.data()), 0) << args[0];
    posix_spawn_file_actions_destroy(&actions);
    posix_spawnattr_destroy(&attr);
  }
  ~Proc() {
    if (status == -1 && pid > 0) {
      kill(pid, SIGKILL);
      waitpid(pid, nullptr, 0);
    }
  }
  /// Exit code, or 128 + signal; -1 (and the process killed) when it runs past `limit`.
  int wait(std::chrono::seconds limit = std::chrono::seconds(60)) {
    const auto until = Clock::now() + limit;
    while (Clock::now() < until) {
      int st = 0;
      if (waitpid(pid, &st, WNOHANG) == pid) {
        status = st;
        return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
      }
      std::this_thread::sleep_for(milliseconds(2));
    }
    kill(pid, SIGKILL);
    waitpid(pid, &status, 0);
    ADD_FAILURE() << "process " << pid << " ran past " << limit.count() << " s; stderr:\n" << read_text(err);
    return -1;
  }
  std::string stderr_text() const { return read_text(err); }
};

bool alive(pid_t pid) {
  if (kill(pid, 0) != 0) return false;
  const auto stat = read_text(fmt::format("/proc/{}/stat", pid));
  const auto paren = stat.rfind(')');
  return paren != std::string::npos && paren + 2 < stat.size() && stat[paren + 2] != 'Z';
}

// "<rank> <pid>" lines that fault_probe --pid-file appended.
std::map<int, pid_t> rank_pids(const fs::path& file) {
  std::map<int, pid_t> pids;
  std::istringstream in(read_text(file));
  int rank = 0;
  pid_t pid = 0;
  while (in >> rank >> pid) pids[rank] = pid;
  return pids;
}

std::vector<std::string> launch(int nproc, std::vector<std::string> program, std::vector<std::string> extra = {},
                                int grace_seconds = kGraceSeconds) {
  std::vector<std::string> args{FASTLEARN_CLI,         "launch",         "--nproc-per-node",
                                std::to_string(nproc), "--grace-period", std::to_string(grace_seconds)};
  args.insert(args.end(), extra.begin(), extra.end());
  args.push_back("--");
  args.insert(args.end(), program.begin(), program.end());
  return args;
}

std::vector<std::string> probe_train(const fs::path& out, std::vector<std::string> extra = {}) {
  std::vector<std::string> args{FASTLEARN_FAULT_PROBE, "train", "--out", out.string()};
  args.insert(args.end(), extra.begin(), extra.end());
  return args;
}

// metrics.json without the timings.
nlohmann::json metrics_of(const fs::path& out) {
  auto j = nlohmann::json::parse(read_text(out / "metrics.json"));
  for (auto& record : j) record.erase("seconds");
  return j;
}

void expect_same_weights(const fs::path& a, const fs::path& b) {
  const auto x = fl::load_safetensors(a), y = fl::load_safetensors(b);
  ASSERT_EQ(x.tensors.size(), y.tensors.size());
  for (std::size_t i = 0; i < x.tensors.size(); ++i) {
    EXPECT_EQ(x.tensors[i].first, y.tensors[i].first);
    EXPECT_TRUE(x.tensors[i].second.equal(y.tensors[i].second)) << x.tensors[i].first << " differs";
  }
}

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// ---- elastic restart, graceful stop, resume --------------------------------------------------------------

struct Reference {
  TempDir dir;
  Reference() {
    Proc p(launch(2, probe_train(dir.path / "run")), dir.path);
    EXPECT_EQ(p.wait(), 0) << p.stderr_text();
  }
};

const Reference& reference() {
  static Reference r;  // one uninterrupted 2-rank run for the tests that compare with it
  return r;
}

TEST(Elastic, ARankKilledInEpoch2Of3RestartsResumesAndEndsWithTheSameMetrics) {
  const auto& ref = reference();
  TempDir dir;
  Proc p(launch(2, probe_train(dir.path, {"--die-rank", "1", "--die-epoch", "1", "--die-batch", "2"}),
                {"--max-restarts", "1"}),
         dir.path, {}, "launch");
  ASSERT_EQ(p.wait(), 0) << p.stderr_text();
  const auto err = p.stderr_text();
  EXPECT_TRUE(contains(err, "rank 1 (local 1, pid ")) << err;
  EXPECT_TRUE(contains(err, "SIGKILL")) << err;
  EXPECT_TRUE(contains(err, "restart 1 of 1")) << err;
  EXPECT_TRUE(contains(err, "resuming from " + (dir.path / "checkpoints" / fl::checkpoint_file_name(1, 2)).string()))
      << "checkpoints every 2 batches: the last one before the kill at batch index 2 is after 2 batches\n"
      << err;
  EXPECT_EQ(metrics_of(dir.path), metrics_of(ref.dir.path / "run"));
  expect_same_weights(dir.path / "models" / "final.safetensors", ref.dir.path / "run" / "models" / "final.safetensors");
}

TEST(GracefulStop, SigtermToTheLauncherStopsEveryRankAtABatchAndTheRunResumes) {
  const auto& ref = reference();
  TempDir dir;
  const auto pid_file = dir.path / "pids";
  {
    // The launcher's default grace period: stopping is quick, but tearing down the Gloo group and exiting
    // takes seconds on a loaded machine.
    constexpr int grace = 10;
    Proc p(launch(2, probe_train(dir.path, {"--sleep-ms", "30", "--pid-file", pid_file.string()}), {}, grace), dir.path,
           {}, "launch");
    // Stop once a few batches ran (the first mid-epoch checkpoint exists).
    const auto until = Clock::now() + std::chrono::seconds(30);
    while (!fs::exists(dir.path / "checkpoints" / fl::checkpoint_file_name(0, 2)) && Clock::now() < until)
      std::this_thread::sleep_for(milliseconds(5));
    const auto start = Clock::now();
    kill(p.pid, SIGTERM);
    EXPECT_EQ(p.wait(), 128 + SIGTERM) << p.stderr_text();
    const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
    std::printf("[ figure ] SIGTERM to the launcher -> 2 training ranks stopped at a batch: %.3f s\n", seconds);
    EXPECT_LT(seconds, grace) << "the ranks stop by themselves, before the launcher's SIGKILL";
    const auto err = p.stderr_text();
    EXPECT_TRUE(contains(err, "stopped; checkpoint")) << err;
    EXPECT_FALSE(contains(err, "still running after the grace period")) << err;
    for (const auto& [rank, pid] : rank_pids(pid_file)) EXPECT_FALSE(alive(pid)) << "rank " << rank;
    EXPECT_NO_THROW(fl::latest_checkpoint(dir.path / "checkpoints", {.skip_torn = false}));
  }
  Proc resumed(launch(2, probe_train(dir.path)), dir.path, {}, "resumed");
  ASSERT_EQ(resumed.wait(), 0) << resumed.stderr_text();
  EXPECT_EQ(metrics_of(dir.path), metrics_of(ref.dir.path / "run"));
  expect_same_weights(dir.path / "models" / "final.safetensors", ref.dir.path / "run" / "models" / "final.safetensors");
}

// ---- SIGKILL at random moments -----------------------------------------------------------------------------

// `runs` 2-rank trainings, each with a random rank SIGKILLed at a random moment.
void kill_a_rank_at_random(int runs, unsigned seed) {
  std::mt19937 rng(seed);
  double worst = 0;
  for (int run = 0; run < runs; ++run) {
    TempDir dir;
    const auto pid_file = dir.path / "pids";
    Proc p(launch(2, probe_train(dir.path, {"--epochs", "100", "--sleep-ms", "2", "--pid-file", pid_file.string()})),
           dir.path, {}, "launch");
    const auto until = Clock::now() + std::chrono::seconds(30);
    while (rank_pids(pid_file).size() < 2 && Clock::now() < until) std::this_thread::sleep_for(milliseconds(1));
    const auto pids = rank_pids(pid_file);
    ASSERT_EQ(pids.size(), 2u) << p.stderr_text();
    const int victim = static_cast<int>(rng() % 2);
    std::this_thread::sleep_for(milliseconds(rng() % 600));  // setup, rendezvous, or training
    const auto start = Clock::now();
    kill(pids.at(victim), SIGKILL);
    const int code = p.wait(std::chrono::seconds(kGraceSeconds + 5));
    const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
    worst = std::max(worst, seconds);
    const auto err = p.stderr_text();
    EXPECT_EQ(code, 128 + SIGKILL) << err;
    EXPECT_LT(seconds, kGraceSeconds + 5.0);
    EXPECT_TRUE(contains(err, fmt::format("rank {} (local {}, pid {}) was killed by signal 9 (SIGKILL)", victim, victim,
                                          pids.at(victim))))
        << "run " << run << ":\n"
        << err;
    for (const auto& [rank, pid] : pids) EXPECT_FALSE(alive(pid)) << "run " << run << ": rank " << rank << " left";
  }
  std::printf("[ figure ] %d runs, rank SIGKILLed at random: launcher exit at most %.3f s after the kill\n", runs,
              worst);
}

TEST(RandomKill, RankOfATwoRankTrainingRuns1To10) { kill_a_rank_at_random(10, 1); }
TEST(RandomKill, RankOfATwoRankTrainingRuns11To20) { kill_a_rank_at_random(10, 2); }

// `runs` SIGKILLs of a process that writes checkpoints in a loop; the newest one loads every time.
void kill_checkpoint_writer_at_random(int runs, unsigned seed) {
  std::mt19937 rng(seed);
  TempDir dir;
  const auto ckpts = dir.path / "checkpoints";
  std::size_t loaded_before = 0;
  int stale = 0;
  for (int run = 0; run < runs; ++run) {
    Proc p({FASTLEARN_FAULT_PROBE, "checkpoint-loop", "--out", dir.path.string()}, dir.path, {}, "loop");
    // Wait until this process wrote one (so that its write loop is running), then kill it at a random moment.
    const auto before = fl::latest_checkpoint(ckpts);
    const auto until = Clock::now() + std::chrono::seconds(30);
    while (fl::latest_checkpoint(ckpts) == before && Clock::now() < until) std::this_thread::sleep_for(milliseconds(1));
    std::this_thread::sleep_for(std::chrono::microseconds(rng() % 40000));
    kill(p.pid, SIGKILL);
    EXPECT_EQ(p.wait(), 128 + SIGKILL) << p.stderr_text();
    for (const auto& e : fs::directory_iterator(ckpts)) stale += e.path().filename().string().starts_with(".");
    try {
      const auto latest = fl::latest_checkpoint(ckpts, {.skip_torn = false});
      ASSERT_TRUE(latest) << "run " << run;
      const auto state = fl::load_safetensors(*latest);
      EXPECT_TRUE(fl::fit_position(state, latest->string())) << *latest;
      loaded_before += state.tensors.size() > 0;
    } catch (const std::exception& e) {
      FAIL() << "run " << run << ": the newest checkpoint does not load: " << e.what();
    }
  }
  EXPECT_EQ(loaded_before, static_cast<std::size_t>(runs));
  std::printf(
      "[ figure ] %d SIGKILLs of a checkpoint writer: the newest checkpoint loaded %zu times; "
      "%d interrupted temporaries seen (removed by the next writer)\n",
      runs, loaded_before, stale);
}

TEST(RandomKill, CheckpointWriterRuns1To25) { kill_checkpoint_writer_at_random(25, 3); }
TEST(RandomKill, CheckpointWriterRuns26To50) { kill_checkpoint_writer_at_random(25, 4); }

// ---- a hung rank ----------------------------------------------------------------------------------------

TEST(Timeout, AHungRankMakesTheOthersFailWithinTheTimeoutNamingTheOperation) {
  TempDir dir;
  const auto start = Clock::now();
  Proc p(launch(2, probe_train(dir.path, {"--hang-rank", "1", "--hang-batch", "3", "--timeout-s", "2"})), dir.path);
  const int code = p.wait(std::chrono::seconds(20));
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  const auto err = p.stderr_text();
  EXPECT_NE(code, 0) << err;
  EXPECT_TRUE(contains(err, "rank 1 hangs at batch 3")) << err;
  EXPECT_TRUE(contains(err, "gradient all_reduce of bucket")) << err;
  EXPECT_TRUE(contains(err, "the timeout is 2000 ms")) << err;
  EXPECT_TRUE(contains(err, "Rank 1 never reached this call")) << "the silent rank is named:\n" << err;
  EXPECT_TRUE(contains(err, "rank 0 (local 0, pid ")) << "the summary names rank 0 as the first failure:\n" << err;
  std::printf("[ figure ] hung rank, 2 s collective timeout: launcher exited after %.2f s\n", seconds);
}

// ---- bad input ------------------------------------------------------------------------------------------

const fs::path kFashion = "/usr/share/datasets/fashion-mnist";

// A copy of the Fashion-MNIST folder (raw files, so that a byte can be changed).
fs::path copy_fashion(const fs::path& to) {
  fs::create_directories(to);
  for (const auto& e : fs::directory_iterator(kFashion)) fs::copy_file(e.path(), to / e.path().filename());
  return to;
}

struct AppRun {
  int code;
  std::string err;
};

AppRun fashion(const fs::path& dir, std::vector<std::string> args, const std::map<std::string, std::string>& env = {}) {
  std::vector<std::string> all{FASTLEARN_FASHION_APP, "--out", (dir / "out").string(), "--epochs", "1"};
  all.insert(all.end(), args.begin(), args.end());
  Proc p(all, dir, env, "fashion");
  return {p.wait(), p.stderr_text()};
}

// Nothing the app would write: no metrics, no log, no checkpoint, no model.
void expect_nothing_written(const fs::path& dir) {
  for (const char* file : {"metrics.json", "history.csv", "models", "checkpoints"})
    EXPECT_FALSE(fs::exists(dir / "out" / file)) << file << " was written";
}

class BadInput : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!fs::exists(kFashion / "train-images-idx3-ubyte.gz"))
      GTEST_SKIP() << "Debian's dataset-fashion-mnist is missing";
  }
  TempDir dir;
};

TEST_F(BadInput, MissingDataFile) {
  const auto data = copy_fashion(dir.path / "data");
  fs::remove(data / "t10k-labels-idx1-ubyte.gz");
  const auto r = fashion(dir.path, {"--data", data.string()});
  EXPECT_EQ(r.code, 1);
  EXPECT_TRUE(contains(r.err, "t10k-labels-idx1-ubyte")) << r.err;
  expect_nothing_written(dir.path);
}

TEST_F(BadInput, CorruptIdx) {
  const auto data = copy_fashion(dir.path / "data");
  const auto file = data / "train-labels-idx1-ubyte.gz";
  fs::resize_file(file, fs::file_size(file) / 2);  // a gzip stream cut in the middle
  const auto r = fashion(dir.path, {"--data", data.string()});
  EXPECT_EQ(r.code, 1);
  EXPECT_TRUE(contains(r.err, file.string())) << r.err;
  expect_nothing_written(dir.path);
}

// A checkpoint of the probe's model (not the app's CNN), written by a short probe run.
fs::path probe_checkpoint(const fs::path& dir) {
  Proc p(probe_train(dir / "probe", {"--epochs", "1"}), dir, {}, "probe");
  EXPECT_EQ(p.wait(), 0) << p.stderr_text();
  return dir / "probe" / "checkpoints" / fl::checkpoint_file_name(1, 0);
}

TEST_F(BadInput, TruncatedCheckpointAndCheckpointOfAnotherModel) {
  const auto other = probe_checkpoint(dir.path);
  ASSERT_TRUE(fs::exists(other));
  auto r = fashion(dir.path, {"--resume", other.string()});
  EXPECT_EQ(r.code, 1);
  EXPECT_TRUE(contains(r.err, other.string() + ": no tensor ")) << r.err;
  EXPECT_TRUE(contains(r.err, "saved from another model")) << r.err;
  expect_nothing_written(dir.path);

  const auto truncated = dir.path / "truncated.safetensors";
  fs::copy_file(other, truncated);
  fs::resize_file(truncated, fs::file_size(truncated) - 100);
  r = fashion(dir.path, {"--resume", truncated.string()});
  EXPECT_EQ(r.code, 1);
  EXPECT_TRUE(contains(r.err, truncated.string())) << r.err;
  EXPECT_TRUE(contains(r.err, "truncated") || contains(r.err, "bytes")) << r.err;
  expect_nothing_written(dir.path);
}

// A tar.gz with one entry of `name` holding `content`.
void write_archive(const fs::path& file, const std::string& name, const std::string& content) {
  archive* a = archive_write_new();
  archive_write_add_filter_gzip(a);
  archive_write_set_format_pax_restricted(a);
  ASSERT_EQ(archive_write_open_filename(a, file.c_str()), ARCHIVE_OK);
  archive_entry* e = archive_entry_new();
  archive_entry_set_pathname(e, name.c_str());
  archive_entry_set_size(e, static_cast<la_int64_t>(content.size()));
  archive_entry_set_filetype(e, AE_IFREG);
  archive_entry_set_perm(e, 0644);
  archive_write_header(a, e);
  archive_write_data(a, content.data(), content.size());
  archive_entry_free(e);
  archive_write_close(a);
  archive_write_free(a);
}

TEST_F(BadInput, UnsafeArchive) {
  const auto archive_file = dir.path / "evil.tar.gz";
  write_archive(archive_file, "../../escaped.txt", "boo");
  const auto home = dir.path / "home";
  const auto r = fashion(dir.path, {"--data", "file://" + archive_file.string()}, {{"FASTLEARN_HOME", home.string()}});
  EXPECT_EQ(r.code, 1);
  EXPECT_TRUE(contains(r.err, "../../escaped.txt")) << r.err;
  EXPECT_FALSE(fs::exists(home / "escaped.txt"));
  EXPECT_FALSE(fs::exists(dir.path / "escaped.txt"));
  EXPECT_FALSE(fs::exists(home / "data" / "fashion-mnist-evil.tar")) << "no half-extracted data folder";
  expect_nothing_written(dir.path);
}

TEST_F(BadInput, ChecksumMismatch) {
  const auto archive_file = dir.path / "data.tar.gz";
  write_archive(archive_file, "train-images-idx3-ubyte", "not really");
  const auto home = dir.path / "home";
  const auto r = fashion(dir.path, {"--data", "file://" + archive_file.string(), "--data-sha256", std::string(64, '0')},
                         {{"FASTLEARN_HOME", home.string()}});
  EXPECT_EQ(r.code, 1);
  EXPECT_TRUE(contains(r.err, "sha256")) << r.err;
  EXPECT_FALSE(fs::exists(home / "data" / "fashion-mnist-data.tar")) << "nothing extracted";
  expect_nothing_written(dir.path);
}

TEST_F(BadInput, RankNotBelowWorldSize) {
  const auto r = fashion(dir.path, {},
                         {{"RANK", "2"},
                          {"WORLD_SIZE", "2"},
                          {"MASTER_ADDR", "127.0.0.1"},
                          {"MASTER_PORT", "29999"},
                          {"LOCAL_RANK", "0"}});
  EXPECT_EQ(r.code, 1);
  EXPECT_TRUE(contains(r.err, "RANK")) << r.err;
  EXPECT_TRUE(contains(r.err, "2")) << r.err;
  expect_nothing_written(dir.path);
}

TEST(BadLaunch, MasterPortInUse) {
  TempDir dir;
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  ASSERT_EQ(listen(fd, 1), 0);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  const int port = ntohs(addr.sin_port);
  Proc p(launch(2, probe_train(dir.path / "out"), {"--master-port", std::to_string(port)}), dir.path);
  const int code = p.wait(std::chrono::seconds(20));
  close(fd);
  const auto err = p.stderr_text();
  EXPECT_NE(code, 0) << err;
  EXPECT_TRUE(contains(err, std::to_string(port))) << err;
  EXPECT_FALSE(fs::exists(dir.path / "out" / "checkpoints")) << "no rank trained";
}

}  // namespace
