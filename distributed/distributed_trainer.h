#pragma once
// DistributedTrainer: the callback that makes a Learner train data parallel (fastai's
// DistributedTrainer). Each phase's loader yields only this rank's share (DistributedDL); a GradReducer
// averages the gradients during backward, communicating only on the last micro-batch under gradient
// accumulation; BatchNorm layers become SyncBatchNorm (sync_bn); validation metrics are computed on the
// predictions of every rank, gathered with the padding removed, so they are exact and the same on every
// rank (the Recorder gathers them through Learner::Coordination::gather_items). Only rank 0 runs the
// rank0_only callbacks (progress, logs) and writes checkpoints; every rank loads after a barrier.
#include <fastlearn/distributed/distrib_ctx.h>
#include <fastlearn/distributed/distributed_dl.h>
#include <fastlearn/distributed/grad_reducer.h>
#include <fastlearn/learner/callback.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace fastlearn {

class Learner;
class ShardedStep;
class ShardedUnits;

/// What each rank keeps of the training state (ZeRO's stages). none: everything, as plain data parallel training.
/// optimizer: the optimizer's state for its share of each parameter only; gradients are all-reduced as without
/// sharding, each rank steps its share, and the updated shares are all-gathered into every rank's parameters.
/// gradients: the same, and each gradient bucket is reduce-scattered instead of all-reduced, so that each rank
/// keeps only its share of the gradients too. The parameters stay whole on every rank.
/// parameters: the same, and each rank keeps only its share of the parameters of each unit (ZeRO stage 3, FSDP): a
/// unit's parameters are gathered for its forward and freed after it, gathered again for its backward and freed once
/// it is done, its gradients reduce-scattered then (see DistributedTrainerOptions::shard_units). Outside a fit the
/// model is whole.
enum class Shard { none, optimizer, gradients, parameters };
std::string_view to_string(Shard shard);
/// "none", "optimizer", "gradients" or "parameters"; ConfigError naming the choices otherwise.
Shard shard_from_name(std::string_view name);

struct DistributedTrainerOptions {
  bool sync_bn = true;            ///< convert BatchNorm layers to SyncBatchNorm
  bool broadcast_buffers = true;  ///< copy rank 0's buffers to every rank before each training forward
  GradReducerOptions reducer;
  Group* group = nullptr;  ///< default: the world group
  /// Attach even in a job of one process (set up explicitly): the whole distributed path (reducer,
  /// SyncBatchNorm, stop votes, gathers) then runs on one device, e.g. to check NCCL with one GPU.
  bool with_one_process = false;
  /// Shard the optimizer's state, or it and the gradients, over the ranks (see Shard). The optimizer must update
  /// each element on its own (SGD, Adam); the shares follow the gradient buckets (see GradReducerOptions).
  Shard shard = Shard::none;
  /// With shard, a save is collective (the optimizer's state is gathered from every rank): how long a rank that
  /// saves waits for the others to arrive before failing with a message, instead of waiting in the gather until
  /// the group's timeout.
  std::chrono::milliseconds arrival_timeout = std::chrono::seconds(30);
  /// With shard = parameters, the units: modules of the model by their dotted path as in named_modules ("*" stands for
  /// any characters of one name: "0.layer*.*" is every residual block of a vision model), each an entry of a Sequential
  /// (LibTorch modules have no hooks: the Sequential runs a wrapper in the entry's place during a fit). Empty: each
  /// entry of the model when it is a Sequential, else each entry of the Sequentials among its children. Parameters
  /// outside every unit stay whole on every rank (sharded as with "gradients").
  std::vector<std::string> shard_units;
  /// With shard = parameters: free a unit's parameters after its forward and gather them again for its backward (the
  /// last unit's are kept, its backward coming next); false keeps every unit's from its forward to its backward.
  bool reshard_after_forward = true;
  /// With shard = parameters: each unit's forward starts gathering the next unit's parameters, each unit's backward
  /// the previous one's, so that the transfer overlaps the compute where the backend runs collectives in the
  /// background (NCCL on its stream, Gloo over TCP on its threads); it holds one unit more. Unset: on, except where
  /// the group's collectives go through shared memory (CPU ranks of one host), which completes a collective in the
  /// call, so nothing overlaps (bench: fsdp_vs_torch).
  std::optional<bool> prefetch;
};

class DistributedTrainer : public Callback {
 public:
  explicit DistributedTrainer(DistributedTrainerOptions options = {});
  ~DistributedTrainer() override;
  std::string name() const override { return "distributed_trainer"; }

  void before_fit() override;
  void before_train() override;
  void before_validate() override;
  void before_batch() override;
  void before_backward() override;
  void after_backward() override;
  CaptureSupport step_capture() const override {
    return {.kind = StepCapture::eager_only,
            .why = "its gradient all-reduces are waited for on the host; steps under DistribCtx are not captured yet"};
  }
  void after_fit() override;

  /// The reducer of the running fit (null outside a fit).
  const GradReducer* reducer() const { return reducer_.get(); }
  /// Puts the learner's loaders back as they were (called when the callback is detached).
  void unwrap_loaders();

 private:
  friend void to_distributed(Learner&, DistributedTrainerOptions);
  friend void detach_distributed(Learner&);
  void attach(Learner& learn);
  void detach(Learner& learn);
  Group& group() const;
  void wrap(DataLoader& loader);
  void enter_collective(const std::string& what);
  // After an exception left a fit: the units' parameters given memory again, without a collective.
  void abandon_units(Learner& learn);

  DistributedTrainerOptions options_;
  std::unique_ptr<GradReducer> reducer_;
  std::unique_ptr<ShardedStep> sharded_;  ///< with shard: the step on this rank's shares
  std::unique_ptr<ShardedUnits> units_;   ///< with shard = parameters, during a fit: the wrapped units
  std::int64_t collective_calls_ = 0;     ///< enter_collective calls so far: the same on every rank
  std::optional<DistributedDL> wrapped_;
};

/// Makes `learn` train data parallel over the process group set up (see DistribCtx): converts BatchNorm
/// when sync_bn, recreates the optimizer if there was one, attaches a DistributedTrainer. No-op with one process.
void to_distributed(Learner& learn, DistributedTrainerOptions options = {});
/// Removes the DistributedTrainer (SyncBatchNorm layers stay; with one process they act as BatchNorm).
void detach_distributed(Learner& learn);

}  // namespace fastlearn
