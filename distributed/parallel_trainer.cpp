#include <fastlearn/distributed/parallel_trainer.h>

#include <fastlearn/core/error.h>
#include <fastlearn/learner/learner.h>

#include <fmt/format.h>
#include <torch/nn/parallel/data_parallel.h>
#include <torch/torch.h>

namespace fastlearn {

void to_parallel(Learner& learn, ParallelOptions options) {
  if (learn.cb<ParallelTrainer>()) throw Error("to_parallel: the learner already runs data parallel");
  if (!torch::cuda::is_available()) {
    throw DistributedError("to_parallel: no CUDA device is visible, and single-process data parallel training "
                           "splits batches across GPUs; on CPU, train data parallel over processes instead "
                           "(DistribCtx + fastlearn launch)");
  }
  if (options.devices.empty()) {
    for (int i = 0; i < static_cast<int>(torch::cuda::device_count()); ++i) {
      options.devices.emplace_back(c10::kCUDA, static_cast<c10::DeviceIndex>(i));
    }
  }
  for (const auto& d : options.devices) {
    if (!d.is_cuda()) throw ConfigError("to_parallel: every device must be a CUDA device, got " + d.str());
  }
  auto sequential = std::dynamic_pointer_cast<torch::nn::SequentialImpl>(learn.model_ptr());
  if (!sequential) {
    throw ConfigError("to_parallel: the model must be a torch::nn::Sequential (replicas are made by cloning it)");
  }
  const auto output = options.output_device.value_or(options.devices.front());
  learn.model().to(options.devices.front());
  learn.dls().to(options.devices.front());
  auto trainer = std::make_shared<ParallelTrainer>();
  trainer->devices = options.devices;
  trainer->previous_forward = learn.set_forward(
      [model = torch::nn::Sequential(sequential), devices = options.devices, output](const std::vector<at::Tensor>& xb) {
        if (xb.size() != 1) throw Error("to_parallel: the model must take one input tensor");
        return torch::nn::parallel::data_parallel(model, xb[0], devices, output);
      });
  learn.add_cb(trainer);
}

void detach_parallel(Learner& learn) {
  auto trainer = learn.cb<ParallelTrainer>();
  if (!trainer) return;
  learn.set_forward(trainer->previous_forward);
  learn.remove_cb(trainer);
}

ParallelCtx::ParallelCtx(Learner& learn, ParallelOptions options) : learn_(learn) { to_parallel(learn, std::move(options)); }

ParallelCtx::~ParallelCtx() { detach_parallel(learn_); }

}  // namespace fastlearn
