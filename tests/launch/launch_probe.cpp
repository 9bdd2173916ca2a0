// launch_probe: a rank program for the launcher tests. Each argument is an action, run in order;
// "r<R>:<action>" runs it only on rank R (from RANK).
//
//   print=TEXT            TEXT and a newline on stdout       write=TEXT   TEXT as is on stdout, flushed
//   eprint=TEXT           TEXT and a newline on stderr       sleep-ms=N   sleep N ms
//   record=DIR            write DIR/rank<R>.restart<K> (K = TORCHELASTIC_RESTART_COUNT): "probe.pid=<pid>",
//                         "probe.grandchild=<pid or 0>", then the whole environment, one KEY=VALUE a line
//   wait=DIR:N            wait until DIR holds N records of this restart
//   grandchild            fork a process that sleeps forever (it stays in the rank's process group)
//   stamp=FILE            write the monotonic clock (ns since boot, as std::chrono::steady_clock) to FILE
//   launcher-fds=FILE     write what the parent's (the launcher's) descriptors 0, 1 and 2 are, one a line
//                         ("pipe:[...]", "/dev/null", "closed", ...)
//   ignore-sigterm        from now on SIGTERM does nothing
//   sigkill               kill this process with SIGKILL
//   exit=N                exit with code N
//   first-attempt-exit=N  exit with code N when TORCHELASTIC_RESTART_COUNT is 0
//   sleep                 sleep forever
//   bind-master=FILE      try to bind MASTER_ADDR:MASTER_PORT (as a store server would, SO_REUSEADDR) and write
//                         "free" or "in use" to FILE
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cctype>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <string>
#include <thread>

extern char** environ;

namespace {

namespace fs = std::filesystem;

int env_int(const char* name, int fallback) {
  const char* value = std::getenv(name);
  return value ? std::atoi(value) : fallback;
}

void write_atomically(const fs::path& path, const std::string& text) {
  const fs::path temp = path.string() + ".tmp";
  std::ofstream(temp) << text;
  fs::rename(temp, path);
}

int count_records(const fs::path& dir, int restart) {
  int n = 0;
  const std::string suffix = ".restart" + std::to_string(restart);
  for (const auto& entry : fs::directory_iterator(dir)) {
    const auto name = entry.path().filename().string();
    if (name.starts_with("rank") && name.ends_with(suffix)) ++n;
  }
  return n;
}

// Whether a listening socket could take MASTER_ADDR:MASTER_PORT now.
bool master_port_free() {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const char* addr = std::getenv("MASTER_ADDR");
  const char* port = std::getenv("MASTER_PORT");
  if (!addr || !port || getaddrinfo(addr, port, &hints, &found) != 0) return false;
  const int fd = socket(found->ai_family, found->ai_socktype, found->ai_protocol);
  const int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  const bool bound = fd >= 0 && bind(fd, found->ai_addr, found->ai_addrlen) == 0;
  if (fd >= 0) close(fd);
  freeaddrinfo(found);
  return bound;
}

[[noreturn]] void sleep_forever() {
  for (;;) pause();
}

}  // namespace

int main(int argc, char** argv) {
  const int rank = env_int("RANK", 0);
  const int restart = env_int("TORCHELASTIC_RESTART_COUNT", 0);
  pid_t grandchild = 0;
  for (int i = 1; i < argc; ++i) {
    std::string action = argv[i];
    if (action.size() > 1 && action[0] == 'r' && std::isdigit(static_cast<unsigned char>(action[1]))) {
      const auto colon = action.find(':');
      if (std::atoi(action.c_str() + 1) != rank) continue;
      action = action.substr(colon + 1);
    }
    const auto eq = action.find('=');
    const std::string name = action.substr(0, eq);
    const std::string value = eq == std::string::npos ? "" : action.substr(eq + 1);
    if (name == "print") {
      std::cout << value << "\n" << std::flush;
    } else if (name == "write") {
      std::cout << value << std::flush;
    } else if (name == "eprint") {
      std::cerr << value << "\n" << std::flush;
    } else if (name == "sleep-ms") {
      std::this_thread::sleep_for(std::chrono::milliseconds(std::atoi(value.c_str())));
    } else if (name == "record") {
      std::string text =
          "probe.pid=" + std::to_string(getpid()) + "\nprobe.grandchild=" + std::to_string(grandchild) + "\n";
      for (char** e = environ; *e; ++e) text.append(*e).append("\n");
      write_atomically(fs::path(value) / ("rank" + std::to_string(rank) + ".restart" + std::to_string(restart)), text);
    } else if (name == "wait") {
      const auto colon = value.rfind(':');
      const fs::path dir = value.substr(0, colon);
      const int n = std::atoi(value.c_str() + colon + 1);
      while (count_records(dir, restart) < n) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    } else if (name == "grandchild") {
      grandchild = fork();
      if (grandchild == 0) sleep_forever();
    } else if (name == "stamp") {
      const auto ns =
          std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
              .count();
      write_atomically(value, std::to_string(ns));
    } else if (name == "launcher-fds") {
      std::string text;
      for (int fd = 0; fd <= 2; ++fd) {
        std::error_code ec;
        const auto target = fs::read_symlink("/proc/" + std::to_string(getppid()) + "/fd/" + std::to_string(fd), ec);
        text += (ec ? std::string("closed") : target.string()) + "\n";
      }
      write_atomically(value, text);
    } else if (name == "ignore-sigterm") {
      std::signal(SIGTERM, SIG_IGN);
    } else if (name == "sigkill") {
      std::fflush(nullptr);
      raise(SIGKILL);
    } else if (name == "exit") {
      std::fflush(nullptr);
      std::exit(std::atoi(value.c_str()));
    } else if (name == "first-attempt-exit") {
      if (restart == 0) {
        std::fflush(nullptr);
        std::exit(std::atoi(value.c_str()));
      }
    } else if (name == "sleep") {
      sleep_forever();
    } else if (name == "stop-for-ms") {
      // Stops itself; a child of its own sends it SIGCONT after `value` ms.
      const pid_t self = getpid();
      if (fork() == 0) {
        std::this_thread::sleep_for(std::chrono::milliseconds(std::atoi(value.c_str())));
        kill(self, SIGCONT);
        _exit(0);
      }
      raise(SIGSTOP);
    } else if (name == "bind-master") {
      write_atomically(value, master_port_free() ? "free" : "in use");
    } else {
      std::cerr << "launch_probe: unknown action '" << argv[i] << "'\n";
      return 64;
    }
  }
  return 0;
}
