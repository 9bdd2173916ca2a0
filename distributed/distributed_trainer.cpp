#include <fastlearn/distributed/distributed_trainer.h>

#include <fastlearn/comm/collectives.h>
#include <fastlearn/comm/runtime.h>
#include <fastlearn/core/error.h>
#include <fastlearn/distributed/parallel_trainer.h>
#include <fastlearn/distributed/sync_batch_norm.h>
#include <fastlearn/learner/callback_order.h>
#include <fastlearn/learner/learner.h>

#include <fmt/format.h>
#include <torch/torch.h>

namespace fastlearn {

DistributedTrainer::DistributedTrainer(DistributedTrainerOptions options) : options_(options) {
  order = cb_order::distributed_trainer;
}

DistributedTrainer::~DistributedTrainer() = default;

Group& DistributedTrainer::group() const { return options_.group ? *options_.group : world_group(); }

void DistributedTrainer::attach(Learner& learn) {
  auto& c = learn.coordination();
  c.rank = group().rank();
  c.all_gather_rows = [this](const at::Tensor& row) {
    const auto device = device_of(group());
    auto mine = row.to(device).contiguous();
    std::vector<at::Tensor> rows;
    for (int r = 0; r < group().size(); ++r) rows.push_back(torch::empty_like(mine));
    all_gather(rows, mine, &group());
    return torch::stack(rows).to(row.device());
  };
  c.barrier = [this] { barrier(&group()); };
  c.gather_items = [this](const at::Tensor& local) { return wrapped_ ? gather_unpadded(local, *wrapped_) : local; };
  c.forget_loader = [this](DataLoader& loader) {
    if (wrapped_ && wrapped_->wrapped() && &wrapped_->loader() == &loader) unwrap_loaders();
  };
  c.any_process = [this](bool mine) {
    // On the group's device: NCCL takes only CUDA tensors.
    auto flag = torch::full({1}, mine ? 1 : 0, torch::TensorOptions().dtype(torch::kInt32).device(device_of(group())));
    all_reduce(flag, ReduceOp::max, &group());
    return flag.item<int>() != 0;
  };
  c.any_process_soon = [this](bool mine) {
    if (!reducer_) return mine;  // outside a fit nothing is reduced: only this process's view
    reducer_->vote(mine);
    return reducer_->take_votes();
  };
}

void DistributedTrainer::detach(Learner& learn) {
  unwrap_loaders();
  learn.coordination() = {};
}

void DistributedTrainer::wrap(DataLoader& loader) {
  unwrap_loaders();
  if (loader.dataset().per_process()) return;  // each rank's own items (the step API's batches): nothing to share out
  wrapped_.emplace(DistributedDL::wrap(loader, options_.group));
}

void DistributedTrainer::unwrap_loaders() {
  if (wrapped_) wrapped_->unwrap();
  wrapped_.reset();
}

void DistributedTrainer::before_fit() {
  auto& l = learn();
  std::vector<std::pair<std::string, at::Tensor>> params;
  for (const auto& p : l.model().named_parameters()) params.emplace_back(p.key(), p.value());
  std::vector<at::Tensor> buffers;
  for (const auto& b : l.model().buffers()) buffers.push_back(b);
  auto reducer_options = options_.reducer;
  reducer_options.divide_by_world_size = false;  // before_backward divides the loss instead: one pass fewer
  reducer_ = std::make_unique<GradReducer>(std::move(params), std::move(buffers), group(), reducer_options);
}

void DistributedTrainer::before_train() { wrap(learn().dls().train()); }

void DistributedTrainer::before_validate() { wrap(*learn().dl); }

void DistributedTrainer::before_batch() {
  if (learn().training && options_.broadcast_buffers && reducer_) reducer_->broadcast_buffers();
}

void DistributedTrainer::before_backward() {
  if (!reducer_) return;
  // The gradients' sum over ranks is then their mean; dividing the scalar loss costs nothing.
  auto& l = learn();
  l.loss_grad = l.loss_grad / static_cast<double>(group().size());
  // Under gradient accumulation only the micro-batch that steps communicates.
  reducer_->set_sync(l.will_step);
}

void DistributedTrainer::after_backward() {
  if (reducer_) reducer_->finalize_if_pending();
}

void DistributedTrainer::after_fit() { reducer_.reset(); }

void to_distributed(Learner& learn, DistributedTrainerOptions options) {
  if (learn.cb<DistributedTrainer>()) throw Error("to_distributed: the learner is already distributed");
  if (learn.cb<ParallelTrainer>()) {
    throw DistributedError(
        "to_distributed: the learner trains on several devices of this process (ParallelTrainer, "
        "distributed.devices); one process per device (DistributedTrainer) does not combine with it: use one or the "
        "other");
  }
  if (!is_initialized() || (world_size() == 1 && !options.with_one_process)) return;
  if (options.sync_bn) {
    convert_sync_batchnorm(learn.model(), options.group);
    if (learn.has_opt()) learn.create_opt();  // the converted layers have new parameter tensors
  }
  // NCCL computes on the rank's own GPU: a learner whose device was left to fastlearn goes there (model, batches,
  // and the optimizer's state at its next step); one given another device cannot train over NCCL. Gloo takes the
  // tensors where the learner has them.
  const auto device = device_of(options.group ? *options.group : world_group());
  if (device.is_cuda() && learn.device() != device) {
    if (!learn.device_is_auto()) {
      throw DistributedError(fmt::format(
          "to_distributed: the learner computes on {} (LearnerOptions::device), but NCCL runs rank {} on {}: leave "
          "the device to fastlearn (it then moves there), give {}, or use the gloo backend",
          learn.device().str(), rank(), device.str(), device.str()));
    }
    learn.to(device);
  }
  auto trainer = std::make_shared<DistributedTrainer>(options);
  learn.add_cb(trainer);
  trainer->attach(learn);
}

DistribCtx::DistribCtx(Learner& learn) : DistribCtx(learn, DistributedTrainerOptions{}) {}

DistribCtx::DistribCtx(Learner& learn, const DistributedTrainerOptions& trainer, const SetupOptions& options)
    : DistribCtx(options) {
  try {
    if (active_ || (trainer.with_one_process && is_initialized())) {
      to_distributed(learn, trainer);
      detach_learner_ = [&learn] { detach_distributed(learn); };
    }
  } catch (...) {
    if (owns_) abort_distrib();
    throw;
  }
}

void detach_distributed(Learner& learn) {
  auto trainer = learn.cb<DistributedTrainer>();
  if (!trainer) return;
  trainer->detach(learn);
  learn.remove_cb(trainer);
}

}  // namespace fastlearn
