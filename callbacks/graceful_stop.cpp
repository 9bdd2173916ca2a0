#include <fastlearn/callbacks/graceful_stop.h>

#include <fastlearn/callbacks/checkpointing.h>
#include <fastlearn/core/detail/text.h>
#include <fastlearn/core/error.h>
#include <fastlearn/learner/callback_order.h>
#include <fastlearn/learner/learner.h>

#include <fmt/format.h>

#include <unistd.h>
#include <cerrno>
#include <cstdio>
#include <cstring>

namespace fastlearn {

namespace {

volatile std::sig_atomic_t g_stop_signal = 0;

void on_stop_signal(int sig) {
  if (g_stop_signal == sig) {  // asked twice: the default action now
    std::signal(sig, SIG_DFL);
    std::raise(sig);
    return;
  }
  g_stop_signal = sig;
  constexpr char message[] = "fastlearn: stop requested, stopping at the next batch boundary (again to stop now)\n";
  [[maybe_unused]] auto written = ::write(2, message, sizeof message - 1);  // async-signal-safe
}

// A signal the process started with ignored stays ignored, as the launcher and Python leave it: a script's
// background jobs get SIGINT ignored so that a Ctrl-C meant for the script does not stop them too.
void install(int sig, struct sigaction* old) {
  if (sigaction(sig, nullptr, old) == 0 && old->sa_handler == SIG_IGN) return;
  struct sigaction action {};
  action.sa_handler = on_stop_signal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;  // a rank blocked in a collective keeps waiting for its peers
  if (sigaction(sig, &action, old) != 0) {
    throw Error(fmt::format("GracefulStop: installing the handler of signal {} failed: {}", sig, std::strerror(errno)));
  }
}

}  // namespace

int stop_signal() { return g_stop_signal; }
void clear_stop_signal() { g_stop_signal = 0; }

GracefulStop::GracefulStop(GracefulStopOptions options) : options_(options) {
  if (options_.check_every_n_batches < 1) {
    throw ConfigError(
        fmt::format("GracefulStop: check_every_n_batches must be >= 1, got {}", options_.check_every_n_batches));
  }
  order = cb_order::graceful_stop;
}

GracefulStop::~GracefulStop() { restore_handlers(); }

void GracefulStop::before_fit() {
  stopped_ = false;
  if (installed_) return;
  install(SIGINT, &old_int_);
  try {
    install(SIGTERM, &old_term_);
  } catch (...) {
    sigaction(SIGINT, &old_int_, nullptr);
    throw;
  }
  installed_ = true;
}

void GracefulStop::after_fit() { restore_handlers(); }

void GracefulStop::restore_handlers() {
  if (!installed_) return;
  sigaction(SIGINT, &old_int_, nullptr);
  sigaction(SIGTERM, &old_term_, nullptr);
  installed_ = false;
}

void GracefulStop::after_batch() {
  const auto& l = learn();
  if (!l.training || (l.iter + 1) % options_.check_every_n_batches != 0) return;
  check(false);
}

void GracefulStop::after_epoch() { check(true); }

void GracefulStop::check(bool epoch_end) {
  auto& l = learn();
  bool stop = g_stop_signal != 0;
  // Between batches the flag rides with the gradient all-reduce (no collective, no wait for the device);
  // at the end of an epoch one small collective agrees at once.
  const auto& agree = epoch_end ? l.coordination().any_process : l.coordination().any_process_soon;
  if (agree) stop = agree(stop);  // every rank calls it at the same point
  if (!stop) return;
  stopped_ = true;
  l.stop_training();  // the whole run: fine_tune does not go on to its unfrozen fit
  if (auto checkpointer = l.cb<Checkpointer>()) {
    const auto file = checkpointer->save_now(epoch_end);
    if (l.coordination().is_main())
      std::fprintf(stderr, "fastlearn: stopped; checkpoint '%s'\n", excerpt(file.string(), 256).c_str());
  }
  throw CancelFitException();
}

}  // namespace fastlearn
