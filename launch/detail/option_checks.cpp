#include <fastlearn/launch/detail/option_checks.h>

#include <fastlearn/core/error.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdlib>

namespace fastlearn::detail {
namespace fs = std::filesystem;

namespace {

// Variables the launcher owns; extra_env may not set them.
constexpr std::array kReservedVariables{"RANK",
                                        "WORLD_SIZE",
                                        "LOCAL_RANK",
                                        "LOCAL_WORLD_SIZE",
                                        "GROUP_RANK",
                                        "GROUP_WORLD_SIZE",
                                        "MASTER_ADDR",
                                        "MASTER_PORT",
                                        "TORCHELASTIC_RESTART_COUNT",
                                        "TORCHELASTIC_MAX_RESTARTS",
                                        "FASTLEARN_PROGRESS_LIVE",
                                        "FASTLEARN_RUN_ID"};

bool is_executable_file(const fs::path& path) {
  struct stat st {};
  return stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) && access(path.c_str(), X_OK) == 0;
}

}  // namespace

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

void validate_options(const LaunchOptions& o) {
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

}  // namespace fastlearn::detail
