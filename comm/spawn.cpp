#include <fastlearn/comm/spawn.h>

#include <cxxabi.h>
#include <fastlearn/comm/process_group.h>
#include <fastlearn/core/error.h>
#include <fastlearn/launch/launcher.h>
#include <fmt/format.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <memory>
#include <mutex>
#include <sstream>
#include <typeinfo>

namespace fastlearn {
namespace fs = std::filesystem;

namespace {

// Set by the parent for its children; the torchrun variables (RANK, ...) come from launch().
constexpr const char* kDirVar = "FASTLEARN_SPAWN_DIR";    // error files and "done" markers of the ranks
constexpr const char* kKeyVar = "FASTLEARN_SPAWN_KEY";    // hash of extra_args: which series of calls
constexpr const char* kCallVar = "FASTLEARN_SPAWN_CALL";  // index of the call within that series
constexpr const char* kNprocsVar = "FASTLEARN_SPAWN_NPROCS";

std::mutex g_mutex;
std::map<std::string, int> g_calls;  // per key: spawn() calls made so far by this process
bool g_in_fn = false;                // this child is running its fn

// FNV-1a of the arguments: a stable name for them that fits an environment variable.
std::string key_of(const std::vector<std::string>& args) {
  std::uint64_t h = 14695981039346656037ull;
  for (const auto& a : args) {
    for (unsigned char c : a) h = (h ^ c) * 1099511628211ull;
    h = (h ^ 0xffu) * 1099511628211ull;  // separator, so {"ab"} and {"a", "b"} differ
  }
  return fmt::format("{:016x}", h);
}

fs::path error_file(const fs::path& dir, int rank) { return dir / fmt::format("rank{}.error", rank); }
fs::path done_file(const fs::path& dir, int rank) { return dir / fmt::format("rank{}.done", rank); }

std::string read_text(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

std::string type_name(const std::type_info& type) {
  int status = 0;
  std::unique_ptr<char, decltype(&std::free)> name(abi::__cxa_demangle(type.name(), nullptr, nullptr, &status),
                                                   &std::free);
  return status == 0 && name ? name.get() : type.name();
}

[[noreturn]] void run_child(int nprocs, const std::function<void(int)>& fn) {
  const fs::path dir = std::getenv(kDirVar);
  const char* rank_text = std::getenv("RANK");
  const int rank = rank_text ? std::atoi(rank_text) : -1;
  int code = 0;
  std::string error;
  if (rank < 0 || rank >= nprocs) {
    error = fmt::format("RANK is '{}' but spawn() was called with nprocs = {}", rank_text ? rank_text : "", nprocs);
  } else {
    try {
      fn(rank);
    } catch (const std::exception& e) {
      error = fmt::format("{}: {}", type_name(typeid(e)), error_text(e));
    } catch (...) {
      error = "an exception not derived from std::exception";
    }
  }
  if (!error.empty()) {
    code = 1;
    std::ofstream(error_file(dir, rank)) << error;
  } else {
    std::ofstream(done_file(dir, rank)) << "done\n";
  }
  std::cout.flush();
  std::cerr.flush();
  std::fflush(nullptr);
  // _exit: the rest of main() (e.g. the other tests of a gtest binary) and static destructors belong to the parent.
  _exit(code);
}

// The program's own argv, as the kernel recorded it.
std::vector<std::string> own_arguments() {
  std::ifstream in("/proc/self/cmdline", std::ios::binary);
  std::vector<std::string> args;
  std::string arg;
  while (std::getline(in, arg, '\0')) args.push_back(arg);
  if (args.empty()) throw DistributedError("spawn: cannot read this program's arguments from /proc/self/cmdline");
  return args;
}

struct TempDir {
  fs::path path;
  TempDir() {
    std::string pattern = (fs::temp_directory_path() / "fastlearn-spawn-XXXXXX").string();
    if (!mkdtemp(pattern.data()))
      throw DistributedError(fmt::format("spawn: cannot create a folder for the ranks' error files in {}: {}",
                                         fs::temp_directory_path().string(), std::strerror(errno)));
    path = pattern;
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
};

}  // namespace

bool in_spawned_process() { return std::getenv(kDirVar) != nullptr && std::getenv(kCallVar) != nullptr; }

void spawn(int nprocs, const std::function<void(int rank)>& fn, SpawnOptions options) {
  if (nprocs < 1) throw ConfigError(fmt::format("spawn: nprocs is {}; it must be at least 1", nprocs));
  if (!fn) throw ConfigError("spawn: the function to run is empty");
  const std::string key = key_of(options.extra_args);
  int call = 0;
  bool ours = false;
  {
    std::lock_guard lock(g_mutex);
    if (g_in_fn)
      throw ConfigError("spawn: called inside a function that spawn() runs; nested spawn() is not supported");
    call = g_calls[key]++;
    if (in_spawned_process()) {
      const char* child_key = std::getenv(kKeyVar);
      ours = child_key && key == child_key && std::atoi(std::getenv(kCallVar)) == call;
      if (!ours) return;  // a call that runs in the parent only (it comes before ours)
      g_in_fn = true;
    }
  }
  if (ours) run_child(nprocs, fn);

  for (const auto& [name, value] : options.extra_env)
    if (name.starts_with("FASTLEARN_SPAWN_"))
      throw ConfigError(fmt::format("spawn: extra_env sets {}, which spawn() sets itself; pick another name", name));

  TempDir dir;
  LaunchOptions launch_options;
  launch_options.nproc_per_node = nprocs;
  launch_options.master_addr = options.master_addr;
  launch_options.master_port = options.master_port;
  launch_options.grace_period = options.grace_period;
  launch_options.prefix_output = options.prefix_output;
  launch_options.out = options.out;
  launch_options.err = options.err;
  launch_options.command = own_arguments();
  launch_options.command.front() = fs::read_symlink("/proc/self/exe").string();
  for (const auto& arg : options.extra_args) launch_options.command.push_back(arg);
  launch_options.extra_env = std::move(options.extra_env);
  launch_options.extra_env[kDirVar] = dir.path.string();
  launch_options.extra_env[kKeyVar] = key;
  launch_options.extra_env[kCallVar] = std::to_string(call);
  launch_options.extra_env[kNprocsVar] = std::to_string(nprocs);

  const LaunchResult result = launch(launch_options);
  if (result.first_failure) {
    const RankExit& first = *result.first_failure;
    const auto file = error_file(dir.path, first.rank);
    const std::string cause =
        fs::exists(file) ? fmt::format("rank {} raised {}", first.rank, read_text(file)) : first.describe();
    throw DistributedError(fmt::format("spawn: {} (of {} ranks); the other ranks were stopped", cause, nprocs));
  }
  if (result.exit_code != 0) throw DistributedError(fmt::format("spawn: {}", result.summary));
  for (int rank = 0; rank < nprocs; ++rank) {
    if (fs::exists(done_file(dir.path, rank))) continue;
    throw DistributedError(fmt::format(
        "spawn: rank {} exited with code 0 without running the function: the re-executed program did not reach "
        "the matching spawn() call. Under GoogleTest pass SpawnOptions::extra_args = "
        "{{\"--gtest_filter=<this test>\"}}; otherwise make the code before spawn() run the same way in the children",
        rank));
  }
}

}  // namespace fastlearn
