#pragma once
// GracefulStop: SIGINT / SIGTERM stop a fit at the next safe point instead of killing it mid-step. During
// a fit (outside one the signals keep their previous action) the signal handler only sets a flag; after
// every training batch (and every epoch) the callback checks it, agreed across the processes of a data
// parallel job so that every rank stops at the same batch and none waits in a collective for a peer that
// has left. Between batches the flag travels inside the gradient all-reduce (GradReducer::vote): no
// collective and no host sync of its own, so a rank stops one batch after the signal on CPU and two on
// CUDA; at the end of an epoch one small all_reduce agrees at once. It then writes a checkpoint when a
// Checkpointer is attached and cancels the fit; the app ends with exit code 128 + signal.
// A second signal of the same kind ends the process at once (the default action).
#include <fastlearn/learner/callback.h>

#include <signal.h>

#include <csignal>
#include <cstdint>

namespace fastlearn {

struct GracefulStopOptions {
  std::int64_t check_every_n_batches = 1;  ///< how often the agreed flag is looked at
};

class GracefulStop : public Callback {
 public:
  explicit GracefulStop(GracefulStopOptions options = {});
  ~GracefulStop() override;
  GracefulStop(const GracefulStop&) = delete;
  GracefulStop& operator=(const GracefulStop&) = delete;
  std::string name() const override { return "graceful_stop"; }

  /// Installs the SIGINT and SIGTERM handlers for the fit; after_fit (or the destructor) puts the previous back.
  void before_fit() override;
  void after_batch() override;
  void after_epoch() override;
  void after_fit() override;

  /// True once a fit was stopped because of a signal (here or on another rank).
  bool stopped() const { return stopped_; }

 private:
  void check(bool epoch_end);
  void restore_handlers();
  GracefulStopOptions options_;
  struct sigaction old_int_ {};
  struct sigaction old_term_ {};
  bool installed_ = false;
  bool stopped_ = false;
};

/// The signal that asked this process to stop (SIGINT or SIGTERM), or 0.
int stop_signal();
/// Forgets a received stop signal (for tests and apps that run several fits).
void clear_stop_signal();

}  // namespace fastlearn
