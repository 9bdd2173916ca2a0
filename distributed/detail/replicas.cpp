#include <fastlearn/distributed/detail/replicas.h>

#include <fastlearn/comm/detail/threads_backend.h>
#include <fastlearn/comm/process_group.h>
#include <fastlearn/comm/runtime.h>
#include <fastlearn/core/detail/error_context.h>
#include <fastlearn/core/detail/text.h>
#include <fastlearn/core/detail/warning.h>
#include <fastlearn/core/error.h>
#include <fastlearn/distributed/sync_batch_norm.h>
#include <fastlearn/models/dropout.h>

#include <ATen/detail/CUDAHooksInterface.h>
#include <c10/core/DeviceGuard.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/torch.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include <algorithm>
#include <numeric>

namespace fastlearn {

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

namespace {

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

Replicas::Replicas(Learner& learn, const std::vector<c10::Device>& devices, const ParallelTrainerOptions& options)
    : learn_(learn), devices_(devices), options_(options), placement_(placement_of(devices)) {}

Replicas::~Replicas() {
  try {
    teardown();
  } catch (...) {  // a destructor must not throw; groups close with abort as a fallback
  }
}

void Replicas::run(const char* what, const std::function<void(int)>& job) {
  try {
    threads_->run(job, [this](int i, const std::string& message) {
      abort_groups(fmt::format("replica {} on {} failed: {}", i, devices_[static_cast<std::size_t>(i)].str(),
                               excerpt(message, 400)));
    });
  } catch (...) {
    broken_ = broken_ || any_group_aborted_;
    for (auto& r : replicas_) r.outputs.clear();
    rethrow_with_context(std::current_exception(), fmt::format("ParallelTrainer ({})", what));
  }
}

void Replicas::build() {
  teardown();
  ++fits_;
  try {
    build_replicas();
  } catch (...) {
    teardown();  // nothing half-made stays: the next forward runs the model alone
    throw;
  }
}

void Replicas::build_replicas() {
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

void Replicas::teardown() {
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

std::vector<bool> Replicas::trainable_flags(const Replica& r) {
  std::vector<bool> out;
  for (const auto& p : r.params) out.push_back(p.requires_grad());
  return out;
}

void Replicas::copy_trainable_flags() {
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
void Replicas::share_parameters() {
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
void Replicas::sync() {
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
void Replicas::follow_modes() {
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

void Replicas::warn_about_shared_dropout(torch::nn::Module& model) {
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

void Replicas::make_groups() {
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
      auto backend =
          make_backend(BackendKind::nccl, store, i, n, {.timeout = options_.timeout, .cuda_device = r.device.index()});
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
void Replicas::abort_groups(const std::string& reason) {
  any_group_aborted_ = true;
  if (replicas_.empty() || !replicas_[0].group) return;
  if (placement_ != Placement::gpus) {
    abort_threads_backend(replicas_[0].group->backend(), reason);
    return;
  }
  for (auto& r : replicas_)
    if (r.group) r.group->close(/*abort=*/true);
}

void Replicas::close_groups() {
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
void Replicas::repair() {
  for (auto& r : replicas_) r.reducer.reset();
  close_groups();
  make_groups();
  copy_buffers_ = true;
}

}  // namespace fastlearn
