#include <fastlearn/distributed/distributed_trainer.h>

#include <fastlearn/callbacks/epoch_logs.h>
#include <fastlearn/callbacks/grad_accumulation.h>
#include <fastlearn/callbacks/progress.h>
#include <fastlearn/callbacks/tensorboard.h>
#include <fastlearn/core/error.h>
#include <fastlearn/distributed/collectives.h>
#include <fastlearn/distributed/runtime.h>
#include <fastlearn/distributed/sync_batch_norm.h>
#include <fastlearn/learner/learner.h>
#include <fastlearn/learner/recorder.h>

#include <torch/torch.h>

namespace fastlearn {

DistributedTrainer::DistributedTrainer(DistributedTrainerOptions options) : options_(std::move(options)) {
  // After the Recorder (50): its validation results are replaced by those of the gathered predictions.
  order = 51;
}

DistributedTrainer::~DistributedTrainer() = default;

Group& DistributedTrainer::group() const { return options_.group ? *options_.group : world_group(); }

void DistributedTrainer::attach(Learner& learn) {
  auto& c = learn.coordination();
  c.writes_files = group().rank() == 0;
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
  c.gather_items = [this](const at::Tensor& local) {
    return wrapped_ ? gather_unpadded(local, *wrapped_) : local;
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
  wrapped_.emplace(DistributedDL::wrap(loader, options_.group));
}

void DistributedTrainer::unwrap_loaders() {
  if (wrapped_) wrapped_->unwrap();
  wrapped_.reset();
}

void DistributedTrainer::before_fit() {
  auto& l = learn();
  // Only rank 0 shows and writes what happens; the others train silently (for this fit).
  if (group().rank() != 0) {
    for (const auto& cb : l.cbs()) {
      if (std::dynamic_pointer_cast<Progress>(cb) || std::dynamic_pointer_cast<CSVLogger>(cb) ||
          std::dynamic_pointer_cast<MetricsJson>(cb) || std::dynamic_pointer_cast<TensorBoardCallback>(cb)) {
        cb->run = false;
      }
    }
  }
  std::vector<std::pair<std::string, at::Tensor>> params;
  for (const auto& p : l.model().named_parameters()) params.emplace_back(p.key(), p.value());
  std::vector<at::Tensor> buffers;
  for (const auto& b : l.model().buffers()) buffers.push_back(b);
  auto reducer_options = options_.reducer;
  reducer_options.divide_by_world_size = false;  // before_backward divides the loss instead: one pass fewer
  reducer_ = std::make_unique<GradReducer>(std::move(params), std::move(buffers), group(), reducer_options);
}

void DistributedTrainer::before_train() { wrap(learn().dls().train()); }

void DistributedTrainer::before_validate() {
  wrap(*learn().dl);
  valid_preds_.clear();
  valid_targets_.clear();
}

void DistributedTrainer::before_batch() {
  if (learn().training && options_.broadcast_buffers && reducer_) reducer_->broadcast_buffers();
}

void DistributedTrainer::before_backward() {
  if (!reducer_) return;
  // The gradients' sum over ranks is then their mean; dividing the scalar loss costs nothing.
  auto& l = learn();
  l.loss_grad = l.loss_grad / static_cast<double>(group().size());
  // Under gradient accumulation only the micro-batch that steps communicates.
  auto accumulation = learn().cb<GradientAccumulation>();
  reducer_->set_sync(!(accumulation && accumulation->accumulating()));
}

void DistributedTrainer::after_backward() {
  if (reducer_) reducer_->finalize_if_pending();
}

void DistributedTrainer::after_batch() {
  auto& l = learn();
  if (l.training || !l.pred.defined() || l.yb.empty()) return;
  valid_preds_.push_back(l.pred.detach());
  valid_targets_.push_back(l.yb.front().detach());
}

void DistributedTrainer::after_validate() {
  auto& l = learn();
  if (!wrapped_ || valid_preds_.empty()) return;
  // The metrics of the whole validation set, the same on every rank, padding removed.
  auto preds = gather_unpadded(at::cat(valid_preds_), *wrapped_);
  auto targets = gather_unpadded(at::cat(valid_targets_), *wrapped_);
  if (auto rec = l.cb<Recorder>()) rec->set_validation(preds, targets, l.loss_func());
  valid_preds_.clear();
  valid_targets_.clear();
}

// (The output callbacks silenced at before_fit get run = true back from the Learner after after_fit.)
void DistributedTrainer::after_fit() { reducer_.reset(); }

void to_distributed(Learner& learn, DistributedTrainerOptions options) {
  if (learn.cb<DistributedTrainer>()) throw Error("to_distributed: the learner is already distributed");
  if (!is_initialized() || (world_size() == 1 && !options.with_one_process)) return;
  if (options.sync_bn) {
    convert_sync_batchnorm(learn.model(), options.group);
    if (learn.has_opt()) learn.create_opt();  // the converted layers have new parameter tensors
  }
  const auto device = distrib_device();
  if (device.is_cuda()) {
    learn.model().to(device);
    learn.dls().to(device);
  }
  auto trainer = std::make_shared<DistributedTrainer>(std::move(options));
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
