#include <fastlearn/launch/detail/launch_signals.h>

#include <fastlearn/core/error.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>

namespace fastlearn::detail {

namespace {

std::atomic<int> g_signal_fd{-1};

extern "C" void on_launcher_signal(int sig) {
  const int saved = errno;
  const unsigned char byte = static_cast<unsigned char>(sig);
  if (const int fd = g_signal_fd.load(); fd >= 0) {
    [[maybe_unused]] const auto n = write(fd, &byte, 1);
  }
  errno = saved;
}

}  // namespace

SignalCatcher::SignalCatcher() {
  if (pipe2(fds_.data(), O_CLOEXEC | O_NONBLOCK) != 0)
    throw DistributedError(fmt::format("launch: cannot create the signal pipe: {}", std::strerror(errno)));
  g_signal_fd = fds_[1];
  struct sigaction action {};
  action.sa_handler = on_launcher_signal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;
  for (std::size_t i = 0; i < kSignals.size(); ++i) {
    sigaction(kSignals[i], nullptr, &previous_[i]);
    if (previous_[i].sa_handler != SIG_IGN) sigaction(kSignals[i], &action, nullptr);
  }
}

SignalCatcher::~SignalCatcher() {
  for (std::size_t i = 0; i < kSignals.size(); ++i) sigaction(kSignals[i], &previous_[i], nullptr);
  g_signal_fd = -1;
  close(fds_[0]);
  close(fds_[1]);
}

std::vector<int> SignalCatcher::take() {
  std::vector<int> signals;
  unsigned char buffer[64];
  ssize_t n = 0;
  while ((n = read(fds_[0], buffer, sizeof buffer)) > 0) signals.insert(signals.end(), buffer, buffer + n);
  return signals;
}

}  // namespace fastlearn::detail
