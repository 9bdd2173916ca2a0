#pragma once
// Helpers shared by the benchmarks that compare against a Python anchor: summary statistics, a
// wall clock, and a Python coprocess driven line by line, so that the two sides' repeats interleave
// (both see the same machine state) while each side keeps its process warm.
#include <fmt/format.h>

#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace bench {

using Clock = std::chrono::steady_clock;

inline double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

struct Stats {
  double median, min, max;
};

inline Stats summarize(std::vector<double> v) {
  if (v.empty()) throw std::runtime_error("bench: no measurement to summarize");
  std::sort(v.begin(), v.end());
  return {v[v.size() / 2], v.front(), v.back()};
}

/// Repeats from FASTLEARN_BENCH_REPEATS (for quick checks), else `fallback`.
inline int repeats(int fallback) {
  const char* env = std::getenv("FASTLEARN_BENCH_REPEATS");
  return env && std::atoi(env) > 0 ? std::atoi(env) : fallback;
}

/// The integer after `--name` among the arguments, else `fallback`.
inline int int_flag(int argc, char** argv, std::string_view name, int fallback) {
  for (int i = 1; i + 1 < argc; ++i) {
    if (argv[i] == name) return std::atoi(argv[i + 1]);
  }
  return fallback;
}

/// Whether `--name` is among the arguments.
inline bool has_flag(int argc, char** argv, std::string_view name) {
  for (int i = 1; i < argc; ++i) {
    if (argv[i] == name) return true;
  }
  return false;
}

/// The first `n` numbers of a reply line ("<seconds> <count> ..."); throws naming the line otherwise.
inline std::vector<double> numbers(const std::string& line, std::size_t n) {
  std::vector<double> out;
  const char* p = line.c_str();
  for (char* end = nullptr; out.size() < n; p = end) {
    const double x = std::strtod(p, &end);
    if (end == p) throw std::runtime_error(fmt::format("bench: expected {} numbers, got the reply '{}'", n, line));
    out.push_back(x);
  }
  return out;
}

/// Runs `command` (a shell command line) and reads the first `n` numbers it prints; throws naming the command
/// when it cannot start or prints fewer.
inline std::vector<double> command_figures(const std::string& command, std::size_t n) {
  std::unique_ptr<FILE, int (*)(FILE*)> pipe(::popen(command.c_str(), "r"), ::pclose);
  if (!pipe) throw std::runtime_error("bench: cannot start " + command);
  std::vector<double> figures(n);
  for (auto& f : figures)
    if (std::fscanf(pipe.get(), "%lf", &f) != 1) throw std::runtime_error("bench: no figures from " + command);
  return figures;
}

/// A child process we talk to by lines: request() writes one line to its stdin and returns the next line
/// of its stdout. Its stderr passes through. The destructor closes its stdin and reaps it.
class Coprocess {
 public:
  explicit Coprocess(const std::vector<std::string>& argv) {
    int in[2], out[2];
    if (pipe(in) != 0 || pipe(out) != 0) throw std::runtime_error("bench: pipe() failed");
    pid_ = fork();
    if (pid_ < 0) throw std::runtime_error("bench: fork() failed");
    if (pid_ == 0) {
      dup2(in[0], STDIN_FILENO);
      dup2(out[1], STDOUT_FILENO);
      close(in[0]), close(in[1]), close(out[0]), close(out[1]);
      std::vector<char*> args;
      for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
      args.push_back(nullptr);
      execvp(args[0], args.data());
      std::perror(("bench: cannot run " + argv[0]).c_str());
      _exit(127);
    }
    close(in[0]), close(out[1]);
    to_ = fdopen(in[1], "w");
    from_ = fdopen(out[0], "r");
    command_ = argv.size() > 1 ? argv[0] + " " + argv[1] : argv[0];
  }
  ~Coprocess() {
    if (to_) std::fclose(to_);
    if (from_) std::fclose(from_);
    int status = 0;
    waitpid(pid_, &status, 0);
  }
  Coprocess(const Coprocess&) = delete;
  Coprocess& operator=(const Coprocess&) = delete;

  /// The next line the child prints (without the newline); throws when it exits first.
  std::string read_line() {
    std::string line;
    for (int c; (c = std::fgetc(from_)) != EOF && c != '\n';) line.push_back(static_cast<char>(c));
    if (line.empty() && std::feof(from_))
      throw std::runtime_error(fmt::format("bench: '{}' exited early (see its errors above)", command_));
    return line;
  }
  std::string request(const std::string& line) {
    std::fputs((line + "\n").c_str(), to_);
    std::fflush(to_);
    return read_line();
  }

 private:
  pid_t pid_ = -1;
  std::FILE* to_ = nullptr;
  std::FILE* from_ = nullptr;
  std::string command_;
};

}  // namespace bench
