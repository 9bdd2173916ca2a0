#include "support/processes.h"

#include "support/build_paths.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <thread>

extern char** environ;

namespace fastlearn::testing {

namespace {

bool describes_a_job(const std::string& name) {
  static const std::array<const char*, 10> prefixes = {
      "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_", "GROUP_RANK", "TORCHELASTIC_", "OMPI_",
      "PMI_",       "MPI_LOCAL",        "SLURM_",  "ROLE_"};
  if (name == "RANK" || name == "WORLD_SIZE") return true;
  for (const char* p : prefixes) {
    if (name.starts_with(p)) return true;
  }
  return false;
}

}  // namespace

std::vector<CommandResult> run_commands(const std::vector<Command>& commands, std::chrono::seconds timeout) {
  std::vector<std::string> base;
  for (char** e = environ; *e; ++e) {
    const std::string entry = *e;
    if (!describes_a_job(entry.substr(0, entry.find('=')))) base.push_back(entry);
  }
  std::vector<pid_t> pids;
  for (const auto& c : commands) {
    if (c.argv.empty()) throw std::invalid_argument("run_commands: a command without argv");
    std::vector<std::string> env = base;
    for (const auto& [k, v] : c.env) env.push_back(k + "=" + v);
    const pid_t pid = fork();
    if (pid < 0) throw std::runtime_error("run_commands: fork failed");
    if (pid == 0) {
      setpgid(0, 0);
      const int fd = open(c.log.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
      if (fd >= 0) {
        dup2(fd, 1);
        dup2(fd, 2);
      }
      std::vector<char*> args, envp;
      for (const auto& a : c.argv) args.push_back(const_cast<char*>(a.c_str()));
      args.push_back(nullptr);
      for (const auto& e : env) envp.push_back(const_cast<char*>(e.c_str()));
      envp.push_back(nullptr);
      execve(args[0], args.data(), envp.data());
      _exit(127);
    }
    setpgid(pid, pid);
    pids.push_back(pid);
  }
  std::vector<CommandResult> results(commands.size());
  std::vector<bool> done(commands.size(), false);
  std::size_t remaining = commands.size();
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (remaining > 0) {
    for (std::size_t i = 0; i < pids.size(); ++i) {
      if (done[i]) continue;
      int status = 0;
      if (waitpid(pids[i], &status, WNOHANG) == pids[i]) {
        done[i] = true;
        --remaining;
        if (WIFEXITED(status)) results[i].exit_code = WEXITSTATUS(status);
        if (WIFSIGNALED(status)) results[i].signal = WTERMSIG(status);
      }
    }
    if (remaining == 0) break;
    if (std::chrono::steady_clock::now() > deadline) {
      for (std::size_t i = 0; i < pids.size(); ++i) {
        if (done[i]) continue;
        kill(-pids[i], SIGKILL);
        int status = 0;
        waitpid(pids[i], &status, 0);
        results[i].timed_out = true;
        results[i].signal = SIGKILL;
      }
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  for (std::size_t i = 0; i < commands.size(); ++i) {
    std::ifstream in(commands[i].log);
    std::stringstream s;
    s << in.rdbuf();
    results[i].output = s.str();
  }
  return results;
}

std::pair<int, std::string> run_shell(const std::string& command) {
  FILE* pipe = popen((command + " 2>&1").c_str(), "r");
  if (!pipe) return {-1, "popen failed"};
  std::string out;
  std::array<char, 4096> buf{};
  while (auto n = std::fread(buf.data(), 1, buf.size(), pipe)) out.append(buf.data(), n);
  const int status = pclose(pipe);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

CommandResult run_cli(const std::string& args) {
  // (appended: GCC 12 warns falsely on std::string(path) + literal)
  std::string command = build_paths::cli();
  auto [code, out] = run_shell(command.append(" ").append(args));
  return {.exit_code = code, .output = std::move(out)};
}

}  // namespace fastlearn::testing
