#include <fastlearn/distributed/sync_batch_norm.h>

#include <fastlearn/comm/collectives.h>
#include <fastlearn/comm/runtime.h>
#include <fastlearn/core/error.h>
#include <fastlearn/distributed/detail/sync_batch_norm_math.h>
#include <fastlearn/models/torchscript.h>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

namespace fastlearn {

namespace {

namespace nn = torch::nn;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Normalizes with the global statistics; backward all-reduces the two per-channel sums the input gradient
// needs, so every rank's input gradient is that of one BatchNorm over the global batch.
struct SyncBatchNormFunction : torch::autograd::Function<SyncBatchNormFunction> {
  // mean and invstd are (C) in the compute dtype; count (one float64 element, on the input's device: reading
  // it on the host would stall a GPU at every layer) is the global number of values per channel.
  // weight and bias are both empty without affine (then they are no inputs of the graph, and needs_input_grad's
  // indices 1 and 2, which count graph inputs only, are not asked for).
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& input, const std::optional<at::Tensor>& weight,
                            const std::optional<at::Tensor>& bias, const at::Tensor& mean, const at::Tensor& invstd,
                            const at::Tensor& count, std::int64_t group) {
    ctx->save_for_backward({input, weight.value_or(at::Tensor()), mean, invstd, count});
    ctx->saved_data["group"] = group;
    return detail::normalize(input, mean, invstd, weight.value_or(at::Tensor()), bias.value_or(at::Tensor()));
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const auto saved = ctx->get_saved_variables();
    const auto& input = saved[0];
    const auto& weight = saved[1];
    const auto& mean = saved[2];
    const auto& invstd = saved[3];
    const auto& count = saved[4];
    auto* group = reinterpret_cast<Group*>(static_cast<std::intptr_t>(ctx->saved_data["group"].toInt()));
    const auto& dy = grad_outputs[0];
    const auto [sum_dy, sum_dy_xmu] = detail::gradient_sums(dy, input, mean);

    at::Tensor grad_input, grad_weight, grad_bias;
    if (weight.defined() && ctx->needs_input_grad(1)) grad_weight = (sum_dy_xmu * invstd).to(weight.scalar_type());
    if (weight.defined() && ctx->needs_input_grad(2)) grad_bias = sum_dy.to(weight.scalar_type());
    if (ctx->needs_input_grad(0)) {
      // One all_reduce of both sums, in float64; every rank joins, also one without items. (Skipped when the
      // input needs no gradient: the graph, hence that answer, is the same on every rank.)
      auto sums = torch::cat({sum_dy, sum_dy_xmu}).to(torch::kDouble);
      all_reduce(sums, ReduceOp::sum, group);
      grad_input = detail::input_gradient(dy, input, mean, invstd, weight, sums, count);
    }
    return {grad_input, grad_weight, grad_bias, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

std::string describe(const SyncBatchNormOptions& o) { return fmt::format("SyncBatchNorm({})", o.num_features); }

void check_options(const SyncBatchNormOptions& o) {
  if (o.num_features <= 0) {
    throw ConfigError(
        fmt::format("SyncBatchNorm: num_features must be > 0 (the C of (N, C, ...) inputs), got {}", o.num_features));
  }
  if (!(o.eps >= 0)) throw ConfigError(fmt::format("{}: eps must be >= 0, got {}", describe(o), o.eps));
}

template <typename Impl>
const Impl* as_batch_norm(const nn::Module& m) {
  return dynamic_cast<const Impl*>(&m);
}

bool is_batch_norm(const nn::Module& m) {
  return as_batch_norm<nn::BatchNorm1dImpl>(m) || as_batch_norm<nn::BatchNorm2dImpl>(m) ||
         as_batch_norm<nn::BatchNorm3dImpl>(m);
}

}  // namespace

SyncBatchNormImpl::SyncBatchNormImpl(SyncBatchNormOptions options_) : options(options_) {
  check_options(options);
  reset();
}

SyncBatchNormImpl::SyncBatchNormImpl(SyncBatchNormOptions options_, State state) : options(options_) {
  check_options(options);
  register_state(std::move(state));
}

void SyncBatchNormImpl::register_state(State state) {
  // Taken-over parameters keep their requires_grad (a frozen BatchNorm stays frozen).
  weight = register_parameter("weight", state.weight, state.weight.defined() && state.weight.requires_grad());
  bias = register_parameter("bias", state.bias, state.bias.defined() && state.bias.requires_grad());
  running_mean = register_buffer("running_mean", state.running_mean);
  running_var = register_buffer("running_var", state.running_var);
  num_batches_tracked = register_buffer("num_batches_tracked", state.num_batches_tracked);
}

void SyncBatchNormImpl::reset() {
  replaced_.reset();  // a new module (a clone, say) took over no BatchNorm
  const auto c = options.num_features;
  State state;
  if (options.affine) {
    state.weight = torch::empty({c}, torch::requires_grad());
    state.bias = torch::empty({c}, torch::requires_grad());
  }
  if (options.track_running_stats) {
    state.running_mean = torch::zeros({c});
    state.running_var = torch::ones({c});
    state.num_batches_tracked = torch::tensor(0, torch::kLong);
  }
  register_state(std::move(state));
  shift_ = at::Tensor();
  reset_parameters();
}

void SyncBatchNormImpl::reset_running_stats() {
  if (!options.track_running_stats) return;
  torch::NoGradGuard no_grad;
  running_mean.zero_();
  running_var.fill_(1);
  num_batches_tracked.zero_();
}

void SyncBatchNormImpl::reset_parameters() {
  reset_running_stats();
  if (!options.affine) return;
  torch::NoGradGuard no_grad;
  weight.fill_(1);
  bias.zero_();
}

void SyncBatchNormImpl::pretty_print(std::ostream& stream) const {
  stream << std::boolalpha << "fastlearn::SyncBatchNorm(" << options.num_features << ", eps=" << options.eps
         << ", momentum=";
  if (options.momentum) {
    stream << *options.momentum;
  } else {
    stream << "None";
  }
  stream << ", affine=" << options.affine << ", track_running_stats=" << options.track_running_stats << ')';
}

std::shared_ptr<SyncBatchNormImpl> SyncBatchNormImpl::from_batch_norm(const nn::Module& batch_norm, Group* group) {
  auto adopt = [&](const auto& bn) {
    const auto& o = bn.options;
    SyncBatchNormOptions sync_options{.num_features = o.num_features(),
                                      .eps = o.eps(),
                                      .momentum = o.momentum(),
                                      .affine = o.affine(),
                                      .track_running_stats = o.track_running_stats(),
                                      .group = group};
    std::shared_ptr<SyncBatchNormImpl> sync(new SyncBatchNormImpl(
        sync_options, State{bn.weight, bn.bias, bn.running_mean, bn.running_var, bn.num_batches_tracked}));
    sync->train(bn.is_training());
    return sync;
  };
  if (const auto* bn = as_batch_norm<nn::BatchNorm1dImpl>(batch_norm)) return adopt(*bn);
  if (const auto* bn = as_batch_norm<nn::BatchNorm2dImpl>(batch_norm)) return adopt(*bn);
  if (const auto* bn = as_batch_norm<nn::BatchNorm3dImpl>(batch_norm)) return adopt(*bn);
  throw ConfigError(
      fmt::format("SyncBatchNormImpl::from_batch_norm: {} is not a torch::nn::BatchNorm1d/2d/3d", batch_norm.name()));
}

Group* SyncBatchNormImpl::sync_group() const {
  Group* group = options.group;
  if (!group) {
    if (!is_initialized()) return nullptr;
    group = &world_group();
  }
  if (!group->is_member()) {
    throw DistributedError(
        fmt::format("{}: rank {} is not a member of group '{}', whose statistics it is set to "
                    "share; give it a group this rank belongs to",
                    describe(options), rank(), group->name()));
  }
  return group->size() > 1 ? group : nullptr;
}

at::Tensor SyncBatchNormImpl::forward(const at::Tensor& input) {
  if (input.dim() < 2 || input.size(1) != options.num_features) {
    throw ConfigError(
        fmt::format("{}: expected an input of shape (N, {}, ...), got [{}]; check the number of "
                    "channels of the layer before it",
                    describe(options), options.num_features, fmt::join(input.sizes(), ", ")));
  }
  // Exactly as torch::nn::BatchNorm: count the batch, and average cumulatively when there is no momentum.
  double factor = options.momentum.value_or(0.0);
  if (is_training() && options.track_running_stats && num_batches_tracked.defined()) {
    num_batches_tracked += 1;
    if (!options.momentum) factor = 1.0 / num_batches_tracked.item<double>();
  }
  if (is_training()) {
    if (Group* group = sync_group()) return forward_distributed(input, *group, factor);
  }
  return nn::functional::detail::batch_norm(input, running_mean, running_var, weight, bias,
                                            is_training() || !options.track_running_stats, factor, options.eps);
}

at::Tensor SyncBatchNormImpl::forward_distributed(const at::Tensor& input, Group& group, double factor) {
  const auto channels = options.num_features;
  // float64 inputs are computed in float64, every other floating type in float32 (as BatchNorm's kernels).
  const auto compute = input.scalar_type() == torch::kDouble ? torch::kDouble : torch::kFloat;
  const auto local = input.numel() / channels;  // values per channel on this rank
  if (!shift_.defined()) shift_ = torch::zeros({channels}, torch::TensorOptions().dtype(torch::kDouble));
  shift_ = shift_.to(input.device());

  // One all_reduce of [sum (x-K) | sum (x-K)^2 | count], K the previous global mean (the same on all ranks).
  auto moments = detail::local_moments(input, shift_, compute);
  all_reduce(moments, ReduceOp::sum, &group);
  // With 2 values here the global count is at least 2: only a rank with fewer reads the sum on the host.
  if (local < 2 && moments[2 * channels].item<double>() < 2) {
    throw ConfigError(
        fmt::format("{}: expected more than 1 value per channel when training, got {} over the {} ranks "
                    "of group '{}' (input [{}] on rank {}); use larger batches",
                    describe(options), moments[2 * channels].item<double>(), group.size(), group.name(),
                    fmt::join(input.sizes(), ", "), rank()));
  }
  auto stats = detail::global_statistics(moments, shift_, options.eps, factor, running_mean, running_var, compute);
  shift_ = stats.shift;
  auto maybe = [](const at::Tensor& t) { return t.defined() ? std::optional<at::Tensor>(t) : std::nullopt; };
  return SyncBatchNormFunction::apply(input, maybe(weight), maybe(bias), stats.mean, stats.invstd, stats.count,
                                      static_cast<std::int64_t>(reinterpret_cast<std::intptr_t>(&group)));
}

namespace {

// Where a BatchNorm sits: `parent`'s child `key` (path is its dotted name from the model).
struct Slot {
  nn::Module* parent;
  std::string key;
  std::string path;
  nn::Module* old;
};

// A BatchNorm of no features (fastai's EmbeddingNN keeps one over its absent continuous inputs) normalizes
// nothing: there is nothing to synchronize, and it stays as it is.
bool has_no_features(const nn::Module& m) {
  for (const auto& p : m.named_parameters(/*recurse=*/false))
    if (p.key() == "weight") return p.value().numel() == 0;
  for (const auto& b : m.named_buffers(/*recurse=*/false))
    if (b.key() == "running_mean") return b.value().numel() == 0;
  return false;
}

void find_batch_norms(nn::Module& module, const std::string& prefix, std::vector<Slot>& slots,
                      std::unordered_map<nn::Module*, std::shared_ptr<nn::Module>>& owned,
                      std::unordered_set<nn::Module*>& visited) {
  if (!visited.insert(&module).second) return;  // a submodule shared by several parents is walked once
  for (const auto& item : module.named_children()) {
    const auto path = prefix.empty() ? item.key() : prefix + "." + item.key();
    if (is_batch_norm(*item.value())) {
      if (has_no_features(*item.value())) continue;
      slots.push_back({&module, item.key(), path, item.value().get()});
      owned.try_emplace(item.value().get(), item.value());
    } else {
      find_batch_norms(*item.value(), path, slots, owned, visited);
    }
  }
}

bool is_container(const nn::Module& m) {
  return dynamic_cast<const nn::SequentialImpl*>(&m) || dynamic_cast<const nn::ModuleListImpl*>(&m) ||
         dynamic_cast<const nn::ModuleDictImpl*>(&m);
}

// A Sequential runs AnyModules, which need the module's concrete type.
nn::AnyModule any_module(const std::shared_ptr<nn::Module>& m) {
  if (auto sync = std::dynamic_pointer_cast<SyncBatchNormImpl>(m)) return nn::AnyModule(sync);
  if (auto bn = std::dynamic_pointer_cast<nn::BatchNorm1dImpl>(m)) return nn::AnyModule(bn);
  if (auto bn = std::dynamic_pointer_cast<nn::BatchNorm2dImpl>(m)) return nn::AnyModule(bn);
  if (auto bn = std::dynamic_pointer_cast<nn::BatchNorm3dImpl>(m)) return nn::AnyModule(bn);
  throw Error(fmt::format("convert_sync_batchnorm: cannot put a {} into a Sequential", m->name()));
}

void replace_child(const Slot& slot, const std::shared_ptr<nn::Module>& module) {
  if (auto* seq = dynamic_cast<nn::SequentialImpl*>(slot.parent)) {
    // Sequential runs its AnyModule list, not its children: swap the entry too.
    for (auto& entry : *seq) {
      if (entry.ptr().get() == slot.old) entry = any_module(module);
    }
  } else if (auto* list = dynamic_cast<nn::ModuleListImpl*>(slot.parent)) {
    for (auto& entry : *list) {
      if (entry.get() == slot.old) entry = module;
    }
  } else if (auto* dict = dynamic_cast<nn::ModuleDictImpl*>(slot.parent)) {
    dict->update(std::vector<std::pair<std::string, std::shared_ptr<nn::Module>>>{{slot.key, module}});  // both maps
    return;
  }
  slot.parent->replace_module(slot.key, module);
}

}  // namespace

void convert_sync_batchnorm(nn::Module& model, Group* group) {
  // A TorchScript module's BatchNorm runs the script's own code (models/torchscript.h): nothing can swap it.
  for (const auto& named : model.named_modules()) {
    const auto& type = named.value()->name();
    const auto* script = dynamic_cast<const models::TorchScriptImpl*>(named.value().get());
    if (const auto where = script ? script->batch_norm() : std::string(); !where.empty()) {
      throw ConfigError(fmt::format(
          "sync_bn: '{}' of the TorchScript model does batch normalization, which cannot become a SyncBatchNorm: its "
          "statistics would be each replica's or rank's own batch's. Set sync_bn = false to train so (config: "
          "distributed.sync_bn = false), or script the model with another normalization (LayerNorm, GroupNorm)",
          where));
    }
    if (type.starts_with("__torch__.") && type.find("BatchNorm") != std::string::npos) {
      throw ConfigError(fmt::format(
          "sync_bn: '{}' is a BatchNorm inside a TorchScript model ({}), which cannot become a SyncBatchNorm: its "
          "statistics would be each replica's or rank's own batch's. Set sync_bn = false to train so (config: "
          "distributed.sync_bn = false), or script the model with another normalization (LayerNorm, GroupNorm)",
          named.key().empty() ? "the model" : named.key(), type));
    }
  }
  if (is_batch_norm(model)) {
    throw ConfigError(
        fmt::format("convert_sync_batchnorm: the model itself is a {}, which cannot be replaced in "
                    "place; make it with SyncBatchNormImpl::from_batch_norm instead",
                    model.name()));
  }
  std::vector<Slot> slots;
  std::unordered_map<nn::Module*, std::shared_ptr<nn::Module>> owned;
  {
    std::unordered_set<nn::Module*> visited;
    find_batch_norms(model, "", slots, owned, visited);
  }
  // Every reference to a BatchNorm must be one we replace: its parents' registrations (and container
  // entries) plus `owned`. Another one, typically a ModuleHolder member of the parent, would keep calling the
  // old module, silently unsynchronized; refuse before changing anything.
  std::unordered_map<nn::Module*, long> expected;
  for (const auto& slot : slots) expected[slot.old] += is_container(*slot.parent) ? 2 : 1;
  std::vector<std::string> held;
  for (const auto& slot : slots) {
    const long extra = owned.at(slot.old).use_count() - 1 - expected.at(slot.old);
    if (extra != 0) {
      held.push_back(
          fmt::format("'{}' ({} more reference(s), e.g. a member of {})", slot.path, extra, slot.parent->name()));
    }
  }
  if (!held.empty()) {
    throw ConfigError(fmt::format(
        "convert_sync_batchnorm: nothing converted: these BatchNorms are also held outside the module tree, so calls "
        "through those references would bypass the SyncBatchNorm: {}. Declare such members as fastlearn::SyncBatchNorm "
        "(it is a plain BatchNorm when not distributed), call the child through the tree (batch_norm_forward), or "
        "drop the other references before converting",
        fmt::join(held, ", ")));
  }
  std::unordered_map<nn::Module*, std::shared_ptr<SyncBatchNormImpl>> converted;
  for (const auto& [old, holder] : owned) {
    auto sync = SyncBatchNormImpl::from_batch_norm(*holder, group);
    sync->replaced_ = holder;
    converted.emplace(old, std::move(sync));
  }
  for (const auto& slot : slots) replace_child(slot, converted.at(slot.old));
}

void revert_sync_batchnorm(nn::Module& model) {
  std::vector<std::pair<Slot, std::shared_ptr<nn::Module>>> found;
  std::unordered_set<nn::Module*> visited;
  std::function<void(nn::Module&)> find = [&](nn::Module& module) {
    if (!visited.insert(&module).second) return;
    for (const auto& item : module.named_children()) {
      if (auto* sync = item.value()->as<SyncBatchNormImpl>()) {
        if (sync->replaced_) found.push_back({{&module, item.key(), item.key(), sync}, item.value()});
      } else {
        find(*item.value());
      }
    }
  };
  find(model);
  for (const auto& [slot, module] : found) {
    auto* sync = module->as<SyncBatchNormImpl>();
    auto original = sync->replaced_;
    original->train(sync->is_training());
    replace_child(slot, original);
  }
}

}  // namespace fastlearn
