#pragma once
// The replicas of a ParallelTrainer: the model copied to each device, each with a thread of its own (ReplicaThreads);
// their parameters shared with replica 0 (CPU, one GPU) or copied from it after a step (GPUs of their own); their
// buffers, train/eval modes and trainable flags kept as replica 0's; the groups they reduce over; and their teardown,
// also after one of them failed. parallel_trainer.cpp runs one step's forward and backward over them.
#include <fastlearn/comm/group.h>
#include <fastlearn/distributed/detail/replica_threads.h>
#include <fastlearn/distributed/grad_reducer.h>
#include <fastlearn/distributed/parallel_trainer.h>
#include <fastlearn/learner/learner.h>

#include <ATen/core/Generator.h>
#include <c10/core/Device.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace fastlearn {

enum class Placement {
  cpu,      // every replica on the CPU: threads backend, shared parameters
  one_gpu,  // every replica on the same GPU: threads backend, shared parameters
  gpus,     // a GPU per replica: NCCL, parameters copied after each step
};

/// "[cpu, cpu]", for messages.
std::string device_list(const std::vector<c10::Device>& devices);
/// Where the replicas are; ConfigError for devices that mix the CPU and GPUs or list a GPU twice beside others.
Placement placement_of(const std::vector<c10::Device>& devices);
bool has_batch_norm(torch::nn::Module& model);

struct Replica {
  c10::Device device{c10::kCPU};
  std::shared_ptr<torch::nn::Module> model;
  ForwardOutputs forward;
  std::vector<at::Tensor> params;   // in model 0's order
  std::vector<at::Tensor> buffers;  // in model 0's order
  std::unique_ptr<Group> group;
  std::unique_ptr<GradReducer> reducer;
  std::optional<at::Generator> generator;
  std::vector<at::Tensor> outputs;  // this batch's outputs for its chunk, with their graph
  std::int64_t rows = 0;            // items in this batch's chunk
};

class Replicas {
 public:
  Replicas(Learner& learn, const std::vector<c10::Device>& devices, const ParallelTrainerOptions& options);
  ~Replicas();  // tears down; never throws
  Replicas(const Replicas&) = delete;
  Replicas& operator=(const Replicas&) = delete;

  ForwardOutputs inner_forward;  ///< the Learner's forward before the trainer's: replica 0's

  bool built() const { return !replicas_.empty(); }
  std::vector<Replica>& all() { return replicas_; }
  const std::vector<Replica>& all() const { return replicas_; }
  Replica& operator[](std::size_t i) { return replicas_[i]; }
  std::size_t size() const { return replicas_.size(); }

  /// The replicas for a fit: copies of the model as it was built (LearnerOptions::replicate), their threads, dropout
  /// streams and groups. Nothing half-made stays when it fails.
  void build();
  /// Back to the model alone: groups closed, SyncBatchNorm reverted, threads ended, the OpenMP team restored.
  void teardown();

  /// Runs job(i) on replica i's thread for every replica and waits; when one fails, the others' collectives are
  /// aborted, their predictions dropped, and the error is thrown again, of its kind, after "ParallelTrainer (what)".
  void run(const char* what, const std::function<void(int)>& job);

  /// Before a forward: the replicas' parameters (GPUs of their own, after a step), buffers and modules' modes become
  /// replica 0's.
  void sync();
  /// After an optimizer step: replicas on GPUs of their own copy the parameters before their next forward.
  void mark_stepped() { stale_params_ = placement_ == Placement::gpus; }
  /// Whether replica 0's trainable flags changed since the replicas last copied them (a freeze or an unfreeze).
  bool trainable_flags_changed() const { return trainable_ != trainable_flags(replicas_[0]); }
  void copy_trainable_flags();
  /// After a failure the groups may be aborted: new ones (the caller makes new reducers).
  bool broken() const { return broken_; }
  void repair();

 private:
  static std::vector<bool> trainable_flags(const Replica& r);
  void build_replicas();
  void share_parameters();
  void follow_modes();
  void warn_about_shared_dropout(torch::nn::Module& model);
  void make_groups();
  void abort_groups(const std::string& reason);
  void close_groups();

  Learner& learn_;
  const std::vector<c10::Device>& devices_;
  const ParallelTrainerOptions& options_;
  const Placement placement_;
  std::vector<Replica> replicas_;
  std::unique_ptr<ReplicaThreads> threads_;
  std::vector<bool> trainable_;
  std::vector<bool> modes_;  // replica 0's modules' training flags the others last followed
  int restore_threads_ = 0;
  std::int64_t fits_ = 0;  // fits the replicas were built for
  bool stale_params_ = false;
  bool copy_buffers_ = false;
  bool broken_ = false;
  std::atomic<bool> any_group_aborted_{false};
};

}  // namespace fastlearn
