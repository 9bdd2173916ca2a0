#pragma once
// DistribCtx: a scope in which this process is part of its distributed job (and, given a Learner, in
// which the learner trains data parallel: see distributed/distributed_trainer.h). It sets up the process group
// only when the job has several processes and none is set up yet (or adopts one rank0_first set up
// implicitly), and on scope exit tears down only what it set up: cleanly after a normal exit, aborting
// NCCL communicators when an exception ends the scope (a peer may be dead). In a job of one
// process it does nothing, so the same program runs with or without a launcher.
#include <fastlearn/comm/runtime.h>

#include <exception>
#include <functional>

namespace fastlearn {

class Learner;
struct DistributedTrainerOptions;

class DistribCtx {
 public:
  explicit DistribCtx(const SetupOptions& options = {});
  /// Also makes `learn` train data parallel for the scope (to_distributed / detach_distributed).
  explicit DistribCtx(Learner& learn);
  DistribCtx(Learner& learn, const DistributedTrainerOptions& trainer, const SetupOptions& options = {});
  ~DistribCtx();
  DistribCtx(const DistribCtx&) = delete;
  DistribCtx& operator=(const DistribCtx&) = delete;

  /// Whether this scope runs distributed (more than one process).
  bool active() const { return active_; }
  /// Whether this scope set up (or adopted) the process group and will tear it down.
  bool owns_setup() const { return owns_; }

 private:
  bool active_ = false;
  bool owns_ = false;
  int uncaught_at_start_ = 0;             // std::uncaught_exceptions() when the scope began
  std::function<void()> detach_learner_;  // set by the Learner constructors (distributed_trainer.cpp)
};

}  // namespace fastlearn
