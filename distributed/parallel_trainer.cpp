#include <fastlearn/distributed/parallel_trainer.h>

#include <fastlearn/comm/detail/threads_backend.h>
#include <fastlearn/comm/group.h>
#include <fastlearn/comm/process_group.h>
#include <fastlearn/comm/runtime.h>
#include <fastlearn/core/detail/error_context.h>
#include <fastlearn/core/detail/text.h>
#include <fastlearn/core/detail/warning.h>
#include <fastlearn/core/device.h>
#include <fastlearn/core/error.h>
#include <fastlearn/distributed/detail/replica_threads.h>
#include <fastlearn/distributed/distributed_trainer.h>
#include <fastlearn/distributed/sync_batch_norm.h>
#include <fastlearn/learner/callback_order.h>
#include <fastlearn/models/dropout.h>

#include <ATen/autocast_mode.h>
#include <ATen/detail/CUDAHooksInterface.h>
#include <c10/core/DeviceGuard.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/torch.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include <algorithm>
#include <atomic>
#include <numeric>

namespace fastlearn {

namespace {

enum class Placement {
  cpu,      // every replica on the CPU: threads backend, shared parameters
  one_gpu,  // every replica on the same GPU: threads backend, shared parameters
  gpus,     // a GPU per replica: NCCL, parameters copied after each step
};

std::string device_list(const std::vector<c10::Device>& devices) {
  std::vector<std::string> names;
  for (const auto& d : devices) names.push_back(d.str());
  return fmt::format("[{}]", fmt::join(names, ", "));
}

Placement placement_of(const std::vector<c10::Device>& devices) {
  const bool all_cpu = std::all_of(devices.begin(), devices.end(), [](const auto& d) { return d.is_cpu(); });
  if (all_cpu) return Placement::cpu;
  const bool all_cuda = std::all_of(devices.begin(), devices.end(), [](const auto& d) { return d.is_cuda(); });
  if (!all_cuda) {
    throw ConfigError(
        fmt::format("ParallelTrainer: devices {} mix the CPU and GPUs (or other devices); give CPUs only "
                    "or GPUs only",
                    device_list(devices)));
  }
  std::vector<int> indices;
  for (const auto& d : devices) indices.push_back(d.index());
  std::sort(indices.begin(), indices.end());
  if (indices.front() == indices.back()) return Placement::one_gpu;
  if (std::adjacent_find(indices.begin(), indices.end()) == indices.end()) return Placement::gpus;
  throw ConfigError(fmt::format(
      "ParallelTrainer: devices {} list a GPU twice beside others; give each replica a GPU of its own, or put every "
      "replica on one GPU",
      device_list(devices)));
}

bool has_batch_norm(torch::nn::Module& model) {
  for (const auto& m : model.modules()) {
    if (m->name().find("BatchNorm") != std::string::npos) return true;
  }
  return false;
}

std::vector<SyncBatchNormImpl*> sync_batch_norms(torch::nn::Module& model) {
  std::vector<SyncBatchNormImpl*> out;
  for (const auto& m : model.modules())
    if (auto* bn = m->as<SyncBatchNormImpl>()) out.push_back(bn);
  return out;
}

// Model i's generator for dropout: seeded from the base seed and i, on the replica's device.
at::Generator replica_generator(const c10::Device& device, std::uint64_t base, int i) {
  const std::uint64_t seed = base + 0x9E3779B97F4A7C15ULL * static_cast<std::uint64_t>(i + 1);
  if (device.is_cpu()) return at::detail::createCPUGenerator(seed);
  auto generator = at::detail::getCUDAHooks().getNewGenerator(device.index());
  generator.set_current_seed(seed);
  return generator;
}

}  // namespace

std::vector<c10::Device> all_gpus() {
  std::vector<c10::Device> out;
  const auto n = torch::cuda::is_available() ? static_cast<int>(torch::cuda::device_count()) : 0;
  for (int i = 0; i < n; ++i) out.emplace_back(c10::kCUDA, static_cast<c10::DeviceIndex>(i));
  return out;
}

// --- the replicas and their threads ------------------------------------------------------------------------------

struct Replica {
  c10::Device device{c10::kCPU};
  std::shared_ptr<torch::nn::Module> model;
  Learner::Forward forward;
  std::vector<at::Tensor> params;   // in model 0's order
  std::vector<at::Tensor> buffers;  // in model 0's order
  std::unique_ptr<Group> group;
  std::unique_ptr<GradReducer> reducer;
  std::optional<at::Generator> generator;
  at::Tensor pred;        // this batch's predictions of its chunk, with their graph
  std::int64_t rows = 0;  // items in this batch's chunk
};

class ParallelTrainer::State {
 public:
  State(Learner& learn, const std::vector<c10::Device>& devices, const ParallelTrainerOptions& options)
      : learn_(learn), devices_(devices), options_(options), placement_(placement_of(devices)) {}
  ~State() {
    try {
      teardown();
    } catch (...) {  // a destructor must not throw; groups close with abort as a fallback
    }
  }

  Learner::Forward inner_forward;
  Learner::Backward inner_backward;

  bool built() const { return !replicas_.empty(); }
  const std::vector<Replica>& replicas() const { return replicas_; }

  void build() {
    teardown();
    ++fits_;
    try {
      build_replicas();
    } catch (...) {
      teardown();  // nothing half-made stays: the next forward runs the model alone
      throw;
    }
  }

  void build_replicas() {
    const int n = static_cast<int>(devices_.size());
    const int before = at::get_num_threads();
    const int share = placement_ == Placement::cpu ? std::max(1, before / n) : 0;
    threads_ = std::make_unique<ReplicaThreads>(n, [share](int) {
      if (share == 0) return;
      at::internal::lazy_init_num_threads();
      at::set_num_threads(share);  // the calling thread's team; the count the process reports is restored below
    });
    if (share > 0) {
      // The caller's team too: its idle OpenMP workers would spin on the cores the replicas compute on.
      at::set_num_threads(share);
      restore_threads_ = before;
    }
    auto& model0 = learn_.model();
    revert_sync_batchnorm(model0);  // copies are made of the model as it was built (its modules' reset())
    std::vector<std::string> names;
    Replica first{.device = devices_[0], .model = learn_.model_ptr(), .forward = inner_forward};
    for (const auto& p : model0.named_parameters()) {
      names.push_back(p.key());
      first.params.push_back(p.value());
    }
    first.buffers = model0.buffers();
    replicas_.push_back(std::move(first));
    // A copy's reset() initializes weights from the default generator: the training's random stream must not see it.
    auto generator = at::detail::getDefaultCPUGenerator();  // a handle to the one default generator
    const auto rng = [&] {
      std::lock_guard lock(generator.mutex());
      return generator.get_state();
    }();
    struct RestoreRng {
      at::Generator& g;
      const at::Tensor& state;
      ~RestoreRng() {
        std::lock_guard lock(g.mutex());
        g.set_state(state);
      }
    } restore_rng{generator, rng};
    for (int i = 1; i < n; ++i) {
      auto copy = learn_.replicate(devices_[static_cast<std::size_t>(i)]);
      copy.model->train(model0.is_training());
      Replica r{.device = devices_[static_cast<std::size_t>(i)], .model = copy.model, .forward = copy.forward};
      auto named = copy.model->named_parameters();
      r.buffers = copy.model->buffers();
      if (named.size() != names.size() || r.buffers.size() != replicas_[0].buffers.size()) {
        throw ConfigError(fmt::format(
            "ParallelTrainer: the copy of the model for replica {} has {} parameters and {} buffers, the model {} and "
            "{}: LearnerOptions::replicate must make the same architecture",
            i, named.size(), r.buffers.size(), names.size(), replicas_[0].buffers.size()));
      }
      for (std::size_t j = 0; j < names.size(); ++j) {
        if (named[j].key() != names[j] || named[j].value().sizes() != replicas_[0].params[j].sizes()) {
          throw ConfigError(
              fmt::format("ParallelTrainer: parameter {} of replica {}'s model is '{}' {}, the model's is '{}' {}: "
                          "LearnerOptions::replicate must make the same architecture",
                          j, i, excerpt(named[j].key()), named[j].value().sizes(), excerpt(names[j]),
                          replicas_[0].params[j].sizes()));
        }
        r.params.push_back(named[j].value());
      }
      replicas_.push_back(std::move(r));
    }
    share_parameters();
    copy_trainable_flags();
    warn_about_shared_dropout(model0);
    // Each fit draws on: a fit's streams do not repeat the last fit's masks.
    const std::uint64_t base = options_.seed.value_or(at::detail::getDefaultCPUGenerator().current_seed()) +
                               0xD1B54A32D192ED03ULL * static_cast<std::uint64_t>(fits_);
    for (int i = 0; i < n; ++i) {
      replicas_[static_cast<std::size_t>(i)].generator =
          replica_generator(devices_[static_cast<std::size_t>(i)], base, i);
    }
    make_groups();
    copy_buffers_ = true;
    modes_.clear();
  }

  void teardown() {
    whole_ = at::Tensor();
    for (auto& r : replicas_) r.reducer.reset();
    close_groups();
    if (!replicas_.empty()) revert_sync_batchnorm(*replicas_[0].model);  // the model as the user made it
    threads_.reset();
    replicas_.clear();
    if (restore_threads_ > 0) {
      at::set_num_threads(restore_threads_);
      restore_threads_ = 0;
    }
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
    if (trainable_ == trainable_flags(replicas_[0])) return;
    for (auto& r : replicas_) r.reducer.reset();
    copy_trainable_flags();
    make_reducers();
  }

  void mark_stepped() {
    stale_params_ = placement_ == Placement::gpus;
    zero_grads_ = true;
  }

  at::Tensor forward(const std::vector<at::Tensor>& xb) {
    if (built() && !learn_.in_fit()) teardown();  // a fit that ended by an exception never reached after_fit
    if (!built()) return inner_forward(xb);
    if (xb.empty()) throw Error("ParallelTrainer: the batch has no input to split over the replicas");
    if (broken_) repair();
    const bool grad = torch::GradMode::is_enabled();
    if (grad && learn_.training && !replicas_[0].reducer) make_reducers();
    sync_replicas();
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
      r.pred = r.forward(chunks[static_cast<std::size_t>(i)]);
      // Autocast caches its casts of the weights per thread: they would be stale after the step.
      if (at::autocast::is_autocast_enabled(r.device.type())) at::autocast::clear_cache();
    });
    std::vector<at::Tensor> preds;
    for (auto& r : replicas_) {
      if (!r.pred.defined()) throw Error("ParallelTrainer: a replica's forward returned no tensor");
      preds.push_back(r.pred.detach().to(devices_[0], true));
    }
    auto whole = at::cat(preds);
    if (grad &&
        std::any_of(replicas_.begin(), replicas_.end(), [](const Replica& r) { return r.pred.requires_grad(); })) {
      whole_ = whole.requires_grad_(true);
    } else {
      drop_graphs();
    }
    return whole;
  }

  void backward(const at::Tensor& loss_grad) {
    if (!built() || !whole_.defined() || !whole_.requires_grad()) {
      if (inner_backward) return inner_backward(loss_grad);
      return loss_grad.backward();
    }
    // The whole loss back-propagates here, as on one device: terms that do not come through the predictions (a
    // penalty on replica 0's weights, say) land in replica 0's .grad, which its reducer then sums with the replicas'.
    for (auto& r : replicas_) {
      if (r.reducer) r.reducer->set_sync(false);
    }
    if (whole_.grad().defined()) whole_.mutable_grad().reset();
    loss_grad.backward();
    auto whole_grad = whole_.grad();
    whole_ = at::Tensor();
    if (!whole_grad.defined()) {
      drop_graphs();
      throw Error(
          "ParallelTrainer: the loss does not depend on the predictions of the replicas (a callback replaced "
          "learn.pred by something computed without them?)");
    }
    for (auto& r : replicas_) {
      if (r.reducer) r.reducer->set_sync(learn_.will_step);
    }
    std::vector<at::Tensor> shares;
    std::int64_t start = 0;
    for (auto& r : replicas_) {
      shares.push_back(whole_grad.narrow(0, start, r.rows));
      start += r.rows;
    }
    const bool zero = zero_grads_;
    run("backward", [&](int i) {
      auto& r = replicas_[static_cast<std::size_t>(i)];
      const c10::DeviceGuard device(r.device);
      if (zero && i > 0) {
        for (auto& p : r.params) p.mutable_grad().reset();  // replica 0's optimizer zeroed its own at the step
      }
      if (r.pred.requires_grad()) {
        const auto& share = shares[static_cast<std::size_t>(i)];
        torch::autograd::backward({r.pred}, {share.device() == r.device ? share : share.to(r.device, true)});
      }
      r.pred = at::Tensor();
      if (r.reducer) r.reducer->finish_backward(/*empty_share=*/r.rows == 0);
    });
    zero_grads_ = false;
  }

 private:
  template <typename Job>
  void run(const char* what, Job&& job) {
    const std::function<void(int)> body = std::forward<Job>(job);
    try {
      threads_->run(body, [this](int i, const std::string& message) {
        abort_groups(fmt::format("replica {} on {} failed: {}", i, devices_[static_cast<std::size_t>(i)].str(),
                                 excerpt(message, 400)));
      });
    } catch (...) {
      broken_ = broken_ || any_group_aborted_;
      drop_graphs();
      rethrow_with_context(std::current_exception(), fmt::format("ParallelTrainer ({})", what));
    }
  }

  void drop_graphs() {
    whole_ = at::Tensor();
    for (auto& r : replicas_) r.pred = at::Tensor();
  }

  static std::vector<bool> trainable_flags(const Replica& r) {
    std::vector<bool> out;
    for (const auto& p : r.params) out.push_back(p.requires_grad());
    return out;
  }

  void copy_trainable_flags() {
    trainable_ = trainable_flags(replicas_[0]);
    for (std::size_t i = 1; i < replicas_.size(); ++i) {
      for (std::size_t j = 0; j < trainable_.size(); ++j) {
        auto& p = replicas_[i].params[j];
        p.set_requires_grad(trainable_[j]);
        if (!trainable_[j]) p.mutable_grad().reset();
      }
    }
  }

  // Replicas on the CPU or on one GPU compute with replica 0's very parameter storage: its optimizer step is theirs.
  void share_parameters() {
    if (placement_ == Placement::gpus) return;
    for (std::size_t i = 1; i < replicas_.size(); ++i) {
      for (std::size_t j = 0; j < replicas_[0].params.size(); ++j) {
        const auto& mine = replicas_[0].params[j];
        auto& theirs = replicas_[i].params[j];
        if (theirs.data_ptr() != mine.data_ptr() || theirs.strides() != mine.strides()) theirs.set_data(mine);
      }
    }
  }

  // Before a forward: the replicas' parameters (GPUs of their own, after a step) and buffers (their statistics
  // differ without SyncBatchNorm; replica 0's are the model's) become replica 0's.
  void sync_replicas() {
    share_parameters();  // a load may have given replica 0 new tensors
    follow_modes();
    const bool params = stale_params_;
    const bool buffers = copy_buffers_ || !options_.sync_bn;
    if (!params && !buffers) return;
    run("copy replica 0's state", [&](int i) {
      if (i == 0) return;
      torch::NoGradGuard no_grad;
      auto& r = replicas_[static_cast<std::size_t>(i)];
      const c10::DeviceGuard device(r.device);
      if (params) {
        for (std::size_t j = 0; j < r.params.size(); ++j) r.params[j].copy_(replicas_[0].params[j], true);
      }
      if (buffers) {
        for (std::size_t j = 0; j < r.buffers.size(); ++j) {
          if (r.buffers[j].data_ptr() != replicas_[0].buffers[j].data_ptr())
            r.buffers[j].copy_(replicas_[0].buffers[j], true);
        }
      }
    });
    stale_params_ = false;
    copy_buffers_ = false;
  }

  // Each replica's modules train or evaluate as replica 0's (TrainEval switches the model, a callback may switch a
  // part, such as frozen BatchNorms).
  void follow_modes() {
    const auto reference = replicas_[0].model->modules();
    std::vector<bool> modes;
    for (const auto& m : reference) modes.push_back(m->is_training());
    if (modes == modes_) return;
    for (std::size_t i = 1; i < replicas_.size(); ++i) {
      const auto theirs = replicas_[i].model->modules();
      for (std::size_t k = 0; k < theirs.size() && k < modes.size(); ++k) theirs[k]->train(modes[k]);  // parents first
    }
    modes_ = std::move(modes);
  }

  void warn_about_shared_dropout(torch::nn::Module& model) {
    for (const auto& m : model.modules()) {
      if (m->as<torch::nn::DropoutImpl>() && !m->as<models::DropoutImpl>()) {
        warn(
            "ParallelTrainer: the model has a torch::nn::Dropout; its replicas draw from the device's shared generator "
            "in whatever order their threads reach it, so runs are not repeatable. models::Dropout draws from a "
            "seeded stream per replica");
        return;
      }
    }
  }

  void make_groups() {
    const int n = static_cast<int>(replicas_.size());
    std::vector<int> ranks(static_cast<std::size_t>(n));
    std::iota(ranks.begin(), ranks.end(), 0);
    if (placement_ != Placement::gpus) {
      auto backends = threads_backends(n);
      for (int i = 0; i < n; ++i) {
        auto& r = replicas_[static_cast<std::size_t>(i)];
        r.group = std::make_unique<Group>("replicas", ranks, i, backends[static_cast<std::size_t>(i)],
                                          BackendKind::threads, options_.timeout);
        r.group->set_device(r.device);
      }
    } else {
      if (!backend_compiled_in(BackendKind::nccl)) {
        throw ConfigError("ParallelTrainer: replicas on GPUs of their own reduce over NCCL, which this build lacks");
      }
      auto store = c10::make_intrusive<c10d::HashStore>();
      run("set up NCCL between the replicas", [&](int i) {
        auto& r = replicas_[static_cast<std::size_t>(i)];
        const c10::DeviceGuard device(r.device);
        auto backend = make_backend(BackendKind::nccl, store, i, n,
                                    {.timeout = options_.timeout, .cuda_device = r.device.index()});
        r.group = std::make_unique<Group>("replicas", ranks, i, backend, BackendKind::nccl, options_.timeout);
        r.group->set_device(r.device);
      });
    }
    any_group_aborted_ = false;
    if (!options_.sync_bn) return;
    // SyncBatchNorm over the replicas; they take over the BatchNorms' tensors, so the optimizer's stay valid.
    for (auto& r : replicas_) {
      convert_sync_batchnorm(*r.model, r.group.get());
      for (auto* bn : sync_batch_norms(*r.model)) bn->options.group = r.group.get();
    }
  }

  // In the thread of a failed replica: the others may wait for it in a collective; make those calls fail.
  void abort_groups(const std::string& reason) {
    any_group_aborted_ = true;
    if (replicas_.empty() || !replicas_[0].group) return;
    if (placement_ != Placement::gpus) {
      abort_threads_backend(replicas_[0].group->backend(), reason);
      return;
    }
    for (auto& r : replicas_)
      if (r.group) r.group->close(/*abort=*/true);
  }

  void close_groups() {
    for (auto& r : replicas_) {
      if (!r.group) continue;
      for (auto* bn : sync_batch_norms(*r.model))
        if (bn->options.group == r.group.get()) bn->options.group = nullptr;
    }
    // NCCL's clean shutdown of a communicator waits for its peers: each replica's thread closes its own at once.
    const bool together =
        placement_ == Placement::gpus && !broken_ && threads_ &&
        std::all_of(replicas_.begin(), replicas_.end(), [](const Replica& r) { return r.group != nullptr; });
    if (together) {
      try {
        threads_->run([&](int i) {
          auto& r = replicas_[static_cast<std::size_t>(i)];
          const c10::DeviceGuard device(r.device);
          r.group->close();
        });
      } catch (const std::exception&) {  // a shutdown that failed: abort what is left below
        broken_ = true;
      }
    }
    for (auto& r : replicas_) {
      if (r.group) r.group->close(/*abort=*/broken_);  // a no-op for those closed above
      r.group.reset();
    }
    broken_ = false;
  }

  // After a failure: new groups (and reducers at the next training forward); the replicas and threads stay.
  void repair() {
    for (auto& r : replicas_) r.reducer.reset();
    close_groups();
    make_groups();
    copy_buffers_ = true;
  }

  Learner& learn_;
  const std::vector<c10::Device>& devices_;
  const ParallelTrainerOptions& options_;
  const Placement placement_;
  std::vector<Replica> replicas_;
  std::unique_ptr<ReplicaThreads> threads_;
  std::vector<bool> trainable_;
  std::vector<bool> modes_;  // replica 0's modules' training flags the others last followed
  at::Tensor whole_;         // the batch's predictions as the Learner sees them (a leaf the loss differentiates to)
  int restore_threads_ = 0;
  std::int64_t fits_ = 0;  // fits the replicas were built for
  bool stale_params_ = false;
  bool copy_buffers_ = false;
  bool zero_grads_ = false;
  bool broken_ = false;
  std::atomic<bool> any_group_aborted_{false};
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
  state_->inner_forward = inner_forward;
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
  learn.set_forward(state_->inner_forward);
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
