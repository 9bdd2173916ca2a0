#include <fastlearn/distributed/distributed_trainer.h>

#include <fastlearn/comm/collectives.h>
#include <fastlearn/comm/detail/shared_memory_backend.h>
#include <fastlearn/comm/runtime.h>
#include <fastlearn/core/detail/warning.h>
#include <fastlearn/core/error.h>
#include <fastlearn/distributed/detail/sharded_step.h>
#include <fastlearn/distributed/detail/sharded_units.h>
#include <fastlearn/distributed/parallel_trainer.h>
#include <fastlearn/distributed/sync_batch_norm.h>
#include <fastlearn/learner/callback_order.h>
#include <fastlearn/learner/learner.h>
#include <fastlearn/optim/optimizer.h>

#include <fmt/format.h>
#include <torch/torch.h>

#include <exception>
#include <optional>
#include <set>
#include <thread>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

namespace fastlearn {

std::string_view to_string(Shard shard) {
  switch (shard) {
    case Shard::none:
      return "none";
    case Shard::optimizer:
      return "optimizer";
    case Shard::gradients:
      return "gradients";
    case Shard::parameters:
      return "parameters";
  }
  return "none";
}

Shard shard_from_name(std::string_view name) {
  for (const auto s : {Shard::none, Shard::optimizer, Shard::gradients, Shard::parameters})
    if (to_string(s) == name) return s;
  throw ConfigError(
      fmt::format("shard '{}' is not one of \"none\", \"optimizer\", \"gradients\", \"parameters\"", name));
}

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
  c.own_items = [this] { return wrapped_ ? std::optional(wrapped_->own_items()) : std::nullopt; };
  c.forget_loader = [this](DataLoader& loader) {
    if (wrapped_ && wrapped_->wrapped() && &wrapped_->loader() == &loader) unwrap_loaders();
  };
  c.any_process = [this](bool mine) {
    // On the group's device: NCCL takes only CUDA tensors.
    auto flag = torch::full({1}, mine ? 1 : 0, torch::TensorOptions().dtype(torch::kInt32).device(device_of(group())));
    all_reduce(flag, ReduceOp::max, &group());
    return flag.item<int>() != 0;
  };
  c.gradient_shares = [this, &learn]() -> std::optional<std::vector<at::Tensor>> {
    if (!sharded_ || !reducer_ || !reducer_->last_stats().scattered || !learn.has_opt()) return std::nullopt;
    return sharded_->gradients(learn.opt());
  };
  c.reduce_over_processes = [this](const at::Tensor& t, bool max) {
    auto on_device = t.to(device_of(group()));
    all_reduce(on_device, max ? ReduceOp::max : ReduceOp::sum, &group());
    if (!on_device.is_same(t)) t.copy_(on_device);
  };
  c.enter_collective = [this](const std::string& what) { enter_collective(what); };
  c.model_sharded = [this] { return units_ && units_->started(); };
  c.whole_model_tensor = [this](const at::Tensor& t) { return units_ ? units_->whole(t) : t; };
  c.fit_failed = [this, &learn] { abandon_units(learn); };
  c.any_process_soon = [this](bool mine) {
    if (!reducer_) return mine;  // outside a fit nothing is reduced: only this process's view
    reducer_->vote(mine);
    return reducer_->take_votes();
  };
}

// Every member counts itself in through the store and waits, briefly, for the others: a call that only some ranks
// make fails here with a message rather than hanging in the collective that follows.
void DistributedTrainer::enter_collective(const std::string& what) {
  auto& g = group();
  if (g.device()) return;  // ranks that are threads of one process: no store (the threads backend names a hang)
  auto& store = dist_store();
  const auto key = fmt::format("fastlearn/collective/{}/{}", g.name(), collective_calls_++);
  store.add(key, 1);
  const auto until = std::chrono::steady_clock::now() + options_.arrival_timeout;
  for (;;) {
    const auto arrived = store.add(key, 0);
    if (arrived >= g.size()) return;
    if (std::chrono::steady_clock::now() >= until) {
      throw DistributedError(fmt::format(
          "rank {}: {} needs every rank of the group, but only {} of its {} ranks arrived within {} ms; call it on "
          "every rank at the same point (with shard = \"{}\" each rank holds part of the optimizer's state)",
          g.ranks()[g.rank()], what, arrived, g.size(), options_.arrival_timeout.count(), to_string(options_.shard)));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

void DistributedTrainer::abandon_units(Learner& learn) {
  if (!units_) return;
  if (sharded_ && sharded_->abandon()) {
    // The optimizer's pieces are this rank's shares of units that are whole no more: its state goes too.
    if (learn.has_opt() && learn.opt().sharded()) learn.drop_opt();
    warn(
        "a fit with shard = \"parameters\" failed: the model's parameters could not be gathered from the other "
        "ranks, so this rank holds its share of them and NaN for the rest, and the optimizer's state is dropped; "
        "load a checkpoint before using the model");
  }
  units_.reset();
  sharded_.reset();
  reducer_.reset();
}

void DistributedTrainer::detach(Learner& learn) {
  abandon_units(learn);
  unwrap_loaders();
  // A sharded optimizer's state is put back together on every rank while the group still exists (collective: every
  // rank detaches at the same point); when an error unwinds, the peers may be gone, so the state is dropped instead.
  if (learn.has_opt() && learn.opt().sharded()) {
    bool whole = false;
    if (std::uncaught_exceptions() == 0) {
      try {
        learn.opt().unshard();
        whole = true;
      } catch (const std::exception& e) {
        warn(
            fmt::format("the sharded optimizer's state could not be gathered when data parallel training ended "
                        "({}); the learner's optimizer is dropped",
                        e.what()));
      }
    }
    if (!whole) learn.drop_opt();
  }
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
  abandon_units(l);  // what an earlier fit that failed left, if anything
  std::vector<std::pair<std::string, at::Tensor>> params;
  std::set<const c10::TensorImpl*> seen;  // a weight two layers share is listed under both names: reduce it once
  for (const auto& p : l.model().named_parameters())
    if (seen.insert(p.value().unsafeGetTensorImpl()).second) params.emplace_back(p.key(), p.value());
  std::vector<at::Tensor> buffers;
  for (const auto& b : l.model().buffers()) buffers.push_back(b);
  auto reducer_options = options_.reducer;
  reducer_options.divide_by_world_size = false;  // before_backward divides the loss instead: one pass fewer
  if (options_.shard != Shard::none) {
    if (l.has_opt() && !l.opt().elementwise())
      throw ConfigError(fmt::format(
          "shard = \"{}\": the optimizer {} reads a whole parameter to update each element of it (a norm), so no rank "
          "can update its share alone; use shard = \"none\" or an elementwise optimizer (SGD, Adam)",
          to_string(options_.shard), l.opt().type()));
    reducer_options.scatter = options_.shard == Shard::gradients || options_.shard == Shard::parameters;
    reducer_options.separate_verdicts = true;
    sharded_ = std::make_unique<ShardedStep>(group());
  }
  if (options_.shard == Shard::parameters) {
    const bool prefetch = options_.prefetch.value_or(group().backend().getBackendName() != shared_memory_backend_name);
    units_ = std::make_unique<ShardedUnits>(l.model(), options_.shard_units, group(), options_.reshard_after_forward,
                                            prefetch);
    // A unit's gradients are one bucket from the first step on: the buckets are final, and sharded, from the start.
    reducer_options.rebuild_buckets = false;
    for (const auto& [name, p] : params) reducer_options.unit_of.push_back(units_->unit_of(p));
  }
  reducer_ = std::make_unique<GradReducer>(std::move(params), std::move(buffers), group(), reducer_options);
}

void DistributedTrainer::before_train() { wrap(learn().dls().train()); }

void DistributedTrainer::before_validate() { wrap(*learn().dl); }

void DistributedTrainer::before_batch() {
  auto& l = learn();
  if (l.training && options_.broadcast_buffers && reducer_) reducer_->broadcast_buffers();
  // Stage 3 shards the parameters at the first training batch, so that whatever runs before it (a checkpoint loaded
  // at before_fit, lr_find's copy of the model) sees them whole.
  if (l.training && units_ && !units_->started() && l.has_opt()) {
    sharded_->adopt_units(*reducer_, l.opt(), units_->params());
    units_->start(*sharded_);
  }
}

void DistributedTrainer::before_backward() {
  if (!reducer_) return;
  // The gradients' sum over ranks is then their mean; dividing the scalar loss costs nothing.
  auto& l = learn();
  l.loss_grad = l.loss_grad / static_cast<double>(group().size());
  // Under gradient accumulation only the micro-batch that steps communicates; with sharded gradients (or parameters)
  // every micro-batch is reduce-scattered into the shares once the buckets are final, so no rank holds whole
  // gradients.
  const bool scatter_always =
      (options_.shard == Shard::gradients || options_.shard == Shard::parameters) && reducer_->layout_final();
  reducer_->set_sync(l.will_step || scatter_always);
}

void DistributedTrainer::after_backward() {
  if (!reducer_) return;
  if (units_) units_->release_all();  // units whose backward left them gathered (the first: its input needs none)
  reducer_->finalize_if_pending();
  auto& l = learn();
  if (sharded_ && l.will_step && l.has_opt()) {
    sharded_->feed(*reducer_, l.opt());
    reducer_->clear_shares();  // the next step's first backward writes them afresh
  }
}

void DistributedTrainer::after_fit() {
  if (units_) {
    // Every rank's model whole again, in its own structure; the optimizer's pieces back in the parameters' memory.
    if (sharded_ && learn().has_opt()) sharded_->make_whole(learn().opt());
    units_.reset();
  }
  reducer_.reset();
  sharded_.reset();  // the optimizer keeps its plan, which holds what its step gathers
}

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
