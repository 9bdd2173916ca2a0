#pragma once
// ParallelTrainer: the callback that makes a Learner train on several devices of one process (fastai's
// ParallelTrainer, without DataParallel's faults). It keeps a replica of the model per device, each driven by a
// thread of its own, for the whole fit: every batch is split into one chunk per replica (sizes differing by at most
// one item; a replica may get none), the replicas run forward at the same time, and the Learner sees the whole
// batch's predictions and computes one loss over them, so every callback sees what it sees with one device. In
// backward each replica back-propagates its chunk's share of that loss, and a GradReducer per replica sums the
// gradients in buckets as they become ready (over the in-process threads backend for replicas on the CPU or on one
// GPU, over NCCL, one communicator per replica thread, for replicas on GPUs of their own). The optimizer steps
// replica 0, which is learn.model(): what is saved, validated and exported. Replicas on the CPU or on one GPU
// share replica 0's parameter storage, so its step is theirs; replicas on other GPUs copy the parameters before
// their next forward.
//
// BatchNorm layers become SyncBatchNorm over the replicas (sync_bn): a batch's statistics are the whole batch's,
// so training equals one device with the whole batch. With sync_bn false each replica normalizes its chunk by
// the chunk's statistics (DataParallel's behaviour) and replica 0's running statistics are kept. models::Dropout
// draws from a seeded stream per replica. Without a checkpointed stream per replica, a resumed fit with dropout is
// not bit-exact (one without dropout is).
#include <fastlearn/distributed/grad_reducer.h>
#include <fastlearn/learner/callback.h>
#include <fastlearn/learner/learner.h>

#include <c10/core/Device.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

namespace fastlearn {

struct ParallelTrainerOptions {
  bool sync_bn = true;  ///< convert BatchNorm layers to SyncBatchNorm over the replicas
  /// Buckets and their sizes; the trainer sets what the threads need (the reduction ends on each replica's thread,
  /// and gradients are summed, the loss being the whole batch's).
  GradReducerOptions reducer;
  std::chrono::milliseconds timeout = std::chrono::minutes(30);  ///< per collective between replicas
  /// Seed of the replicas' dropout streams (replica i draws from a generator seeded from it and i). Default: the
  /// seed of LibTorch's default CPU generator (so manual_seed / set_seed make runs repeatable).
  std::optional<std::uint64_t> seed;
};

/// Every visible GPU (none on a machine without one).
std::vector<c10::Device> all_gpus();

class ParallelTrainer : public Callback {
 public:
  ParallelTrainer(std::vector<c10::Device> devices, ParallelTrainerOptions options = {});
  ~ParallelTrainer() override;
  std::string name() const override { return "parallel_trainer"; }

  void before_fit() override;
  void before_batch() override;
  void after_step() override;
  CaptureSupport step_capture() const override {
    return {.kind = StepCapture::eager_only, .why = "its replicas run on threads of their own, one per device"};
  }
  void after_fit() override;

  const std::vector<c10::Device>& devices() const { return devices_; }
  /// The number of replicas (devices).
  int replica_count() const { return static_cast<int>(devices_.size()); }
  /// Replica `i`'s model while the replicas exist (during a fit; replica 0 is the learner's model); Error otherwise.
  torch::nn::Module& replica(int i) const;
  /// Replica `i`'s gradient reducer during a fit (null outside one).
  const GradReducer* reducer(int i) const;

  class State;

 private:
  friend void to_parallel(Learner&, std::vector<c10::Device>, ParallelTrainerOptions);
  friend void detach_parallel(Learner&);
  void attach(Learner& learn);
  void detach(Learner& learn);

  std::vector<c10::Device> devices_;
  ParallelTrainerOptions options_;
  std::shared_ptr<State> state_;  // shared: the learner's forward and backward hold it weakly
};

/// Makes `learn` train on `devices` of this process (default: every visible GPU; the CPU listed n times gives n CPU
/// replicas, each thread, and the caller during a fit, with its share of the intra-op threads): moves the learner to
/// devices[0] when its device was left to fastlearn and attaches a ParallelTrainer (one added with add_cb instead does
/// the same at its first fit). With sync_bn, BatchNorm layers are SyncBatchNorm over the replicas during each fit and
/// BatchNorm again after it (a SyncBatchNorm that convert_sync_batchnorm made earlier comes back as BatchNorm too).
/// Fewer than two devices: nothing (and a warning, once). ConfigError for devices it cannot use together (the CPU with
/// GPUs, a GPU listed twice beside others, BatchNorm synchronized on one shared GPU); DistributedError in a job of
/// several processes or under a DistributedTrainer (one process per device, or several devices in one process: not
/// both).
void to_parallel(Learner& learn, std::vector<c10::Device> devices = {}, ParallelTrainerOptions options = {});
/// Removes the ParallelTrainer; the learner then runs its model alone, as before to_parallel.
void detach_parallel(Learner& learn);

/// to_parallel for a scope: detach_parallel at its end.
class ParallelCtx {
 public:
  explicit ParallelCtx(Learner& learn, std::vector<c10::Device> devices = {}, ParallelTrainerOptions options = {});
  ~ParallelCtx();
  ParallelCtx(const ParallelCtx&) = delete;
  ParallelCtx& operator=(const ParallelCtx&) = delete;
  /// Whether the learner trains on several devices in this scope.
  bool active() const { return learn_ != nullptr; }

 private:
  Learner* learn_ = nullptr;
};

}  // namespace fastlearn
