#include <fastlearn/distributed/parallel_trainer.h>

#include <fastlearn/comm/runtime.h>
#include <fastlearn/core/detail/warning.h>
#include <fastlearn/core/device.h>
#include <fastlearn/core/error.h>
#include <fastlearn/distributed/detail/replicas.h>
#include <fastlearn/distributed/distributed_trainer.h>
#include <fastlearn/learner/callback_order.h>
#include <fastlearn/models/dropout.h>
#include <fastlearn/models/torchscript.h>

#include <ATen/autocast_mode.h>
#include <c10/core/DeviceGuard.h>
#include <fmt/format.h>
#include <torch/torch.h>

#include <algorithm>
#include <atomic>
#include <functional>

namespace fastlearn {

std::vector<c10::Device> all_gpus() {
  std::vector<c10::Device> out;
  const auto n = torch::cuda::is_available() ? static_cast<int>(torch::cuda::device_count()) : 0;
  for (int i = 0; i < n; ++i) out.emplace_back(c10::kCUDA, static_cast<c10::DeviceIndex>(i));
  return out;
}

// --- one step over the replicas ----------------------------------------------------------------------------------

class ParallelTrainer::State {
 public:
  State(Learner& learn, const std::vector<c10::Device>& devices, const ParallelTrainerOptions& options)
      : learn_(learn), options_(options), replicas_(learn, devices, options) {}

  ForwardOutputs& inner_forward() { return replicas_.inner_forward; }
  Learner::Backward inner_backward;

  bool built() const { return replicas_.built(); }
  const std::vector<Replica>& replicas() const { return replicas_.all(); }

  void build() { replicas_.build(); }

  void teardown() {
    whole_.clear();
    replicas_.teardown();
  }

  void make_reducers() {
    auto options = options_.reducer;
    options.divide_by_world_size = false;  // the chunks' gradients are shares of one loss: their sum is its gradient
    options.finish_in_engine = false;      // finish_backward, on the replica's thread
    run("make the gradient reducers", [&](int i) {
      auto& r = replicas_[static_cast<std::size_t>(i)];
      std::vector<std::pair<std::string, at::Tensor>> named;
      for (const auto& p : r.model->named_parameters()) named.emplace_back(p.key(), p.value());
      r.reducer = std::make_unique<GradReducer>(std::move(named), r.buffers, *r.group, options);
    });
  }

  // Called before each training batch: a callback may have frozen or unfrozen layers since the reducers were made.
  void follow_trainable_flags() {
    if (!replicas_.trainable_flags_changed()) return;
    for (auto& r : replicas_.all()) r.reducer.reset();
    replicas_.copy_trainable_flags();
    make_reducers();
  }

  void mark_stepped() {
    replicas_.mark_stepped();
    zero_grads_ = true;
  }

  std::vector<at::Tensor> forward(const std::vector<at::Tensor>& xb) {
    if (built() && !learn_.in_fit()) teardown();  // a fit that ended by an exception never reached after_fit
    if (!built()) return replicas_.inner_forward(xb);
    if (xb.empty()) throw Error("ParallelTrainer: the batch has no input to split over the replicas");
    if (replicas_.broken()) repair();
    const bool grad = torch::GradMode::is_enabled();
    if (grad && learn_.training && !replicas_[0].reducer) make_reducers();
    replicas_.sync();
    const std::int64_t rows = xb[0].dim() > 0 ? xb[0].size(0) : 0;
    for (std::size_t k = 0; k < xb.size(); ++k) {
      if (xb[k].dim() == 0 || xb[k].size(0) != rows) {
        throw Error(
            fmt::format("ParallelTrainer: input {} of the batch has {} rows but input 0 has {}: every input is "
                        "split by its first dimension",
                        k, xb[k].dim() == 0 ? 0 : xb[k].size(0), rows));
      }
    }
    const auto n = static_cast<std::int64_t>(replicas_.size());
    std::int64_t start = 0;
    std::vector<std::vector<at::Tensor>> chunks(replicas_.size());
    for (std::int64_t i = 0; i < n; ++i) {
      auto& r = replicas_[static_cast<std::size_t>(i)];
      r.rows = rows / n + (i < rows % n ? 1 : 0);
      for (const auto& x : xb) {
        auto part = x.narrow(0, start, r.rows);
        chunks[static_cast<std::size_t>(i)].push_back(part.device() == r.device ? part : part.to(r.device, true));
      }
      start += r.rows;
    }
    run("forward", [&](int i) {
      auto& r = replicas_[static_cast<std::size_t>(i)];
      const c10::DeviceGuard device(r.device);
      const models::DropoutGeneratorScope dropout(*r.generator);
      r.outputs = r.forward(chunks[static_cast<std::size_t>(i)]);
      // Autocast caches its casts of the weights per thread: they would be stale after the step.
      if (at::autocast::is_autocast_enabled(r.device.type())) at::autocast::clear_cache();
    });
    // Each output of the whole batch: the replicas' chunks of it, in order.
    const auto n_outputs = replicas_[0].outputs.size();
    std::vector<at::Tensor> whole;
    bool any_grad = false;
    for (std::size_t k = 0; k < n_outputs; ++k) {
      std::vector<at::Tensor> chunks_of_k;
      bool grad_k = false;
      for (auto& r : replicas_.all()) {
        if (r.outputs.size() != n_outputs || !r.outputs[k].defined() || r.outputs[k].dim() == 0 ||
            r.outputs[k].size(0) != r.rows) {
          const auto what = r.outputs.size() != n_outputs ? std::string("missing")
                            : !r.outputs[k].defined()     ? std::string("undefined")
                            : r.outputs[k].dim() == 0
                                ? std::string("a scalar")
                                : fmt::format("of {} rows for {} items", r.outputs[k].size(0), r.rows);
          drop_graphs();
          throw Error(fmt::format(
              "ParallelTrainer: output {} of a replica's forward is {}: the replicas' outputs are joined along the "
              "batch, so each must have a row per item of the replica's chunk",
              k, what));
        }
        grad_k = grad_k || r.outputs[k].requires_grad();
        chunks_of_k.push_back(r.outputs[k].detach().to(replicas_[0].device, true));
      }
      whole.push_back(at::cat(chunks_of_k));
      if (grad && grad_k) whole.back().requires_grad_(true);
      any_grad = any_grad || grad_k;
    }
    if (n_outputs == 0) throw Error("ParallelTrainer: a replica's forward returned no tensor");
    if (grad && any_grad) {
      whole_ = whole;
    } else {
      drop_graphs();
    }
    return whole;
  }

  void backward(const at::Tensor& loss_grad) {
    if (!built() || whole_.empty()) {
      if (inner_backward) return inner_backward(loss_grad);
      return loss_grad.backward();
    }
    // The whole loss back-propagates here, as on one device: terms that do not come through the predictions (a
    // penalty on replica 0's weights, say) land in replica 0's .grad, which its reducer then sums with the replicas'.
    for (auto& r : replicas_.all()) {
      if (r.reducer) r.reducer->set_sync(false);
    }
    for (auto& w : whole_) {
      if (w.grad().defined()) w.mutable_grad().reset();
    }
    loss_grad.backward();
    std::vector<at::Tensor> whole_grads;
    for (const auto& w : whole_) whole_grads.push_back(w.grad());
    whole_.clear();
    if (std::none_of(whole_grads.begin(), whole_grads.end(), [](const at::Tensor& g) { return g.defined(); })) {
      drop_graphs();
      throw Error(
          "ParallelTrainer: the loss does not depend on the predictions of the replicas (a callback replaced "
          "learn.pred by something computed without them?)");
    }
    for (auto& r : replicas_.all()) {
      if (r.reducer) r.reducer->set_sync(learn_.will_step);
    }
    std::vector<std::vector<at::Tensor>> shares(replicas_.size());  // [replica][output]
    for (const auto& whole_grad : whole_grads) {
      std::int64_t start = 0;
      for (std::size_t i = 0; i < replicas_.size(); ++i) {
        const auto rows = replicas_[i].rows;
        shares[i].push_back(whole_grad.defined() ? whole_grad.narrow(0, start, rows) : at::Tensor());
        start += rows;
      }
    }
    const bool zero = zero_grads_;
    run("backward", [&](int i) {
      auto& r = replicas_[static_cast<std::size_t>(i)];
      const c10::DeviceGuard device(r.device);
      if (zero && i > 0) {
        for (auto& p : r.params) p.mutable_grad().reset();  // replica 0's optimizer zeroed its own at the step
      }
      std::vector<at::Tensor> outputs, grads;
      for (std::size_t k = 0; k < r.outputs.size(); ++k) {
        const auto& share = shares[static_cast<std::size_t>(i)][k];
        if (!r.outputs[k].requires_grad() || !share.defined()) continue;
        outputs.push_back(r.outputs[k]);
        grads.push_back(share.device() == r.device ? share : share.to(r.device, true));
      }
      if (!outputs.empty()) torch::autograd::backward(outputs, grads);
      r.outputs.clear();
      if (r.reducer) r.reducer->finish_backward(/*empty_share=*/r.rows == 0);
    });
    zero_grads_ = false;
  }

 private:
  // Replicas::run, which drops the replicas' graphs when one fails; and the whole batch's.
  void run(const char* what, const std::function<void(int)>& job) {
    try {
      replicas_.run(what, job);
    } catch (...) {
      whole_.clear();
      throw;
    }
  }

  void drop_graphs() {
    whole_.clear();
    for (auto& r : replicas_.all()) r.outputs.clear();
  }

  // After a failure: new groups, and new reducers at the next training forward.
  void repair() {
    for (auto& r : replicas_.all()) r.reducer.reset();
    replicas_.repair();
  }

  Learner& learn_;
  const ParallelTrainerOptions& options_;
  Replicas replicas_;
  std::vector<at::Tensor> whole_;  // the batch's outputs as the Learner sees them (leaves the loss differentiates to)
  bool zero_grads_ = false;
};

// --- the callback ---------------------------------------------------------------------------------------------

ParallelTrainer::ParallelTrainer(std::vector<c10::Device> devices, ParallelTrainerOptions options)
    : devices_(std::move(devices)), options_(options) {
  order = cb_order::distributed_trainer;
  if (devices_.size() < 2) {
    throw ConfigError(fmt::format("ParallelTrainer: {} device(s) given; it needs at least two", devices_.size()));
  }
  for (auto& d : devices_) d = resolve_device(d, "ParallelTrainer's device");
  placement_of(devices_);
}

ParallelTrainer::~ParallelTrainer() = default;

torch::nn::Module& ParallelTrainer::replica(int i) const {
  if (!state_ || !state_->built() || i < 0 || i >= replica_count()) {
    throw Error(
        fmt::format("ParallelTrainer::replica({}): the replicas exist during a fit, 0 to {}", i, replica_count() - 1));
  }
  return *state_->replicas()[static_cast<std::size_t>(i)].model;
}

const GradReducer* ParallelTrainer::reducer(int i) const {
  if (!state_ || !state_->built() || i < 0 || i >= replica_count()) return nullptr;
  return state_->replicas()[static_cast<std::size_t>(i)].reducer.get();
}

void ParallelTrainer::attach(Learner& learn) {
  const auto env = dist_env();
  if (learn.cb<DistributedTrainer>() || (is_initialized() && world_size() > 1) || env.world_size > 1) {
    throw DistributedError(fmt::format(
        "to_parallel: this process is rank {} of a job of {} processes ({}){}; several devices in one process "
        "(ParallelTrainer, distributed.devices) and one process per device (DistributedTrainer, --nproc-per-node) "
        "do not combine: use one or the other",
        env.rank, std::max(env.world_size, is_initialized() ? world_size() : 1), env.source,
        learn.cb<DistributedTrainer>() ? " and trains under a DistributedTrainer" : ""));
  }
  if (placement_of(devices_) == Placement::one_gpu && options_.sync_bn && has_batch_norm(learn.model())) {
    throw ConfigError(fmt::format(
        "to_parallel: the replicas on {} share one GPU and the model has BatchNorm layers, which sync_bn would "
        "synchronize inside backward, where replicas on one GPU run one after another; set sync_bn to false "
        "(per-chunk statistics) or give each replica a GPU of its own",
        devices_[0].str()));
  }
  for (const auto& m : learn.model().modules()) {
    const auto* script = dynamic_cast<const models::TorchScriptImpl*>(m.get());
    if (const auto where = script ? script->dropout() : ""; !where.empty()) {
      warn(
          fmt::format("to_parallel: the TorchScript model draws dropout masks in '{}' from torch's global generator, "
                      "which the replicas share: their masks differ from one device's (and between runs)",
                      where));
      break;
    }
  }
  if (learn.device() != devices_[0]) {
    if (!learn.device_is_auto()) {
      throw ConfigError(fmt::format(
          "to_parallel: the learner computes on {} (LearnerOptions::device), but replica 0 (the learner's model) is "
          "on {}: list {} first, or leave the device to fastlearn",
          learn.device().str(), devices_[0].str(), learn.device().str()));
    }
    learn.to(devices_[0]);
  }
  state_ = std::make_shared<State>(learn, devices_, options_);
  // The learner keeps these after a remove_cb: without the state they run the model as before.
  std::weak_ptr<State> weak = state_;
  auto inner_forward = learn.set_forward(nullptr);
  auto inner_backward = learn.set_backward(nullptr);
  state_->inner_forward() = inner_forward;
  state_->inner_backward = inner_backward;
  learn.set_forward([weak, inner_forward](const std::vector<at::Tensor>& xb) {
    if (auto state = weak.lock()) return state->forward(xb);
    return inner_forward(xb);
  });
  learn.set_backward([weak, inner_backward](const at::Tensor& loss_grad) {
    if (auto state = weak.lock()) return state->backward(loss_grad);
    if (inner_backward) return inner_backward(loss_grad);
    loss_grad.backward();
  });
}

void ParallelTrainer::detach(Learner& learn) {
  if (!state_) return;
  state_->teardown();
  learn.set_forward(state_->inner_forward());
  learn.set_backward(state_->inner_backward);
  state_.reset();
}

void ParallelTrainer::before_fit() {
  if (!state_) attach(learn());  // added with add_cb rather than to_parallel
  state_->build();
  state_->make_reducers();
}

void ParallelTrainer::before_batch() {
  if (state_ && learn().training && state_->built()) state_->follow_trainable_flags();
}

void ParallelTrainer::after_step() {
  if (state_) state_->mark_stepped();
}

void ParallelTrainer::after_fit() {
  if (state_) state_->teardown();
}

void to_parallel(Learner& learn, std::vector<c10::Device> devices, ParallelTrainerOptions options) {
  if (learn.cb<ParallelTrainer>()) throw Error("to_parallel: the learner already trains on several devices");
  if (devices.empty()) devices = all_gpus();
  if (devices.size() < 2) {
    static std::atomic<bool> said{false};
    if (!said.exchange(true)) {
      warn(
          fmt::format("to_parallel: {} device(s) ({}), so the learner trains on one as before; give at least two "
                      "(the CPU may be listed several times)",
                      devices.size(), device_list(devices)));
    }
    return;
  }
  auto trainer = std::make_shared<ParallelTrainer>(std::move(devices), options);
  trainer->attach(learn);
  try {
    learn.add_cb(trainer);
  } catch (...) {
    trainer->detach(learn);
    throw;
  }
}

void detach_parallel(Learner& learn) {
  auto trainer = learn.cb<ParallelTrainer>();
  if (!trainer) return;
  trainer->detach(learn);
  learn.remove_cb(trainer);
}

ParallelCtx::ParallelCtx(Learner& learn, std::vector<c10::Device> devices, ParallelTrainerOptions options) {
  to_parallel(learn, std::move(devices), options);
  if (learn.cb<ParallelTrainer>()) learn_ = &learn;
}

ParallelCtx::~ParallelCtx() {
  if (learn_) detach_parallel(*learn_);
}

}  // namespace fastlearn
