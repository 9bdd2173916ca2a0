#pragma once
// ParallelTrainer: single-process data parallel training over several CUDA devices (fastai's
// ParallelTrainer, torch's DataParallel): each batch is split across the devices, the model is replicated
// on each, and the outputs are gathered on the first device; gradients flow back to the original
// parameters. It needs CUDA devices: without them to_parallel says so and changes nothing. For CPU
// (and for speed on GPUs too) use data parallel training over processes: DistribCtx.
#include <fastlearn/learner/callback.h>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <functional>
#include <optional>
#include <vector>

namespace fastlearn {

class Learner;

struct ParallelOptions {
  std::vector<c10::Device> devices;        ///< default: every visible CUDA device
  std::optional<c10::Device> output_device;  ///< default: the first device
};

/// Makes `learn` run its model data parallel over the devices (a torch::nn::Sequential model; the model
/// and the loaders move to the first device). DistributedError when there is no CUDA device.
void to_parallel(Learner& learn, ParallelOptions options = {});
/// Runs the model on its device again.
void detach_parallel(Learner& learn);

/// RAII: to_parallel for the scope, detach_parallel at its end (also on exceptions).
class ParallelCtx {
 public:
  explicit ParallelCtx(Learner& learn, ParallelOptions options = {});
  ~ParallelCtx();
  ParallelCtx(const ParallelCtx&) = delete;
  ParallelCtx& operator=(const ParallelCtx&) = delete;

 private:
  Learner& learn_;
};

/// Marks a learner as running data parallel over devices (the forward replacement itself is installed
/// by to_parallel); detach_parallel restores the previous forward.
class ParallelTrainer : public Callback {
 public:
  std::string name() const override { return "parallel_trainer"; }
  std::vector<c10::Device> devices;
  std::function<at::Tensor(const std::vector<at::Tensor>&)> previous_forward;
};

}  // namespace fastlearn
