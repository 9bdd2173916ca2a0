#include <fastlearn/optim/optimizer.h>

#include <fastlearn/core/detail/cuda_graph.h>
#include <fastlearn/core/detail/memory_order.h>
#include <fastlearn/core/detail/text.h>
#include <fastlearn/core/error.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/torch.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <initializer_list>
#include <optional>
#include <set>
#include <string_view>
#include <unordered_map>

namespace fastlearn {

namespace {

std::string state_name(std::size_t group, std::size_t index, const std::string& name) {
  return fmt::format("{}.{}.{}", group, index, name);
}

std::string shape_of(const at::Tensor& t) { return fmt::format("[{}]", fmt::join(t.sizes(), ", ")); }

std::vector<std::string> keys_of(const Hypers& hypers) {
  std::vector<std::string> keys;
  for (const auto& [k, v] : hypers) keys.push_back(k);
  return keys;
}

// Parses a decimal index of a state tensor name; nullopt when `s` is not one.
std::optional<std::size_t> parse_index(std::string_view s) {
  std::size_t value = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), value);
  if (ec != std::errc() || end != s.data() + s.size() || s.empty()) return std::nullopt;
  return value;
}

[[noreturn]] void load_fail(const std::string& what) {
  throw CheckpointError(fmt::format("Optimizer::load_state: {}", what));
}

}  // namespace

// The value of a hyper-parameter inside step_group, where the group index is not known.
double Optimizer::read_hyper(const ParamGroup& group, const char* name, const char* algorithm) {
  const auto it = group.hypers.find(name);
  if (it == group.hypers.end())
    throw ConfigError(
        fmt::format("{}: a parameter group has no hyper-parameter '{}' (it has: {}); keep the hypers "
                    "the optimizer was created with",
                    algorithm, name, fmt::join(keys_of(group.hypers), ", ")));
  return it->second;
}

void Optimizer::check_finite(const std::string& name, double value, const std::string& where) {
  if (!std::isfinite(value))
    throw ConfigError(
        fmt::format("{}: hyper-parameter '{}' must be finite, got {}; check the value or the schedule "
                    "that produced it",
                    where, name, value));
}

// Whether two tensors lay out the same elements at the same offsets.
bool Optimizer::same_layout(const at::Tensor& a, const at::Tensor& b) {
  return a.sizes() == b.sizes() && a.strides() == b.strides();
}

// Whether ATen's fused kernels can update `p` from `g`: they walk raw memory element by element, so any
// dense layout (contiguous, channels-last) works as long as the parameter, its gradient and its state share
// it. The CUDA kernels also refuse an empty tensor and want one device and dtype per call.
bool Optimizer::fusable(const at::Tensor& p, const at::Tensor& g, bool cuda_too) {
  const auto dtype = p.scalar_type();
  const bool floating = dtype == at::kFloat || dtype == at::kDouble || dtype == at::kHalf || dtype == at::kBFloat16;
  const bool device_ok = p.device() == g.device() && (p.is_cpu() || (cuda_too && p.is_cuda() && p.numel() > 0));
  return floating && device_ok && p.layout() == at::kStrided && g.layout() == at::kStrided &&
         g.scalar_type() == dtype && p.is_non_overlapping_and_dense() && same_layout(p, g);
}

at::Tensor Optimizer::fused_operand(const at::Tensor& t) {
  if (!t.is_cpu() || t.is_contiguous()) return t;
  return memory_order(t);
}

const std::vector<at::Tensor>& Optimizer::step_views_on(GroupState& state, const c10::Device& device) {
  if (device.is_cpu()) return state.step_views;
  for (const auto& [on, views] : state.device_step_views)
    if (on == device) return views;
  const auto copy = state.step_tensor.pin_memory().to(device, /*non_blocking=*/true);
  std::vector<at::Tensor> views;
  views.reserve(state.step_views.size());
  for (std::int64_t i = 0; i < copy.size(0); ++i) views.push_back(copy.select(0, i));
  return state.device_step_views.emplace_back(device, std::move(views)).second;
}

// Gradients the update can use: dense and shaped like their parameter. Checked before anything changes.
void Optimizer::check_grads(const ParamGroup& group, const std::vector<std::size_t>& active, const char* algorithm) {
  for (const auto i : active) {
    const auto& p = group.params[i];
    const auto& g = p.grad();
    if (g.is_sparse())
      throw ConfigError(
          fmt::format("{}: parameter {} of its group has a sparse gradient, which is not supported; use "
                      "a dense embedding (sparse=false)",
                      algorithm, i));
    if (g.sizes() != p.sizes())
      throw ConfigError(fmt::format("{}: parameter {} of its group has shape {} but its gradient has shape {}",
                                    algorithm, i, shape_of(p), shape_of(g)));
  }
}

std::vector<ParamGroup> Optimizer::make_groups(std::vector<std::vector<at::Tensor>> params, const Hypers& hypers) {
  std::vector<ParamGroup> groups;
  groups.reserve(params.size());
  for (auto& p : params) groups.push_back({std::move(p), hypers});
  return groups;
}

void Optimizer::validate_lr(double lr, const char* algorithm) {
  check_finite("lr", lr, algorithm);
  if (lr < 0) throw ConfigError(fmt::format("{}: lr must be >= 0, got {}", algorithm, lr));
}

// ---------------------------------------------------------------------------------------------------------------
// Optimizer

Optimizer::Optimizer(std::vector<ParamGroup> groups) : groups_(std::move(groups)) {
  if (groups_.empty())
    throw ConfigError("Optimizer: no parameter groups; pass at least one group (an empty group is fine)");
  std::unordered_map<const c10::TensorImpl*, std::pair<std::size_t, std::size_t>> seen;
  for (std::size_t g = 0; g < groups_.size(); ++g) {
    const auto& params = groups_[g].params;
    for (std::size_t i = 0; i < params.size(); ++i) {
      const auto& p = params[i];
      if (!p.defined())
        throw ConfigError(fmt::format("Optimizer: parameter {} of group {} is an undefined tensor", i, g));
      if (!p.is_floating_point())
        throw ConfigError(
            fmt::format("Optimizer: parameter {} of group {} has dtype {}; only floating-point tensors "
                        "can be optimized",
                        i, g, c10::toString(p.scalar_type())));
      const auto [it, fresh] = seen.emplace(p.unsafeGetTensorImpl(), std::pair{g, i});
      if (!fresh)
        throw ConfigError(
            fmt::format("Optimizer: parameter {} of group {} is also parameter {} of group {}; each "
                        "parameter may appear only once",
                        i, g, it->second.second, it->second.first));
    }
    for (const auto& [name, value] : groups_[g].hypers) check_finite(name, value, fmt::format("Optimizer group {}", g));
  }
  states_.resize(groups_.size());
  exempt_.resize(groups_.size());
  for (std::size_t g = 0; g < groups_.size(); ++g) {
    exempt_[g].assign(groups_[g].params.size(), false);
    auto& st = states_[g];
    const auto n = groups_[g].params.size();
    st.steps.assign(n, 0);
    st.step_tensor = at::zeros({static_cast<std::int64_t>(n)}, at::kFloat);
    for (std::size_t i = 0; i < n; ++i) st.step_views.push_back(st.step_tensor.select(0, static_cast<std::int64_t>(i)));
  }
}

Optimizer::~Optimizer() = default;

void Optimizer::exempt_from_weight_decay(const std::vector<at::Tensor>& params) {
  std::set<const c10::TensorImpl*> wanted;
  for (const auto& p : params) wanted.insert(p.unsafeGetTensorImpl());
  for (std::size_t g = 0; g < groups_.size(); ++g)
    for (std::size_t i = 0; i < groups_[g].params.size(); ++i)
      if (wanted.contains(groups_[g].params[i].unsafeGetTensorImpl())) exempt_[g][i] = true;
}

bool Optimizer::decays(std::size_t group, std::size_t index) const {
  if (group >= exempt_.size() || index >= exempt_[group].size())
    throw ConfigError(fmt::format("Optimizer::decays: no parameter {} in group {}", index, group));
  return !exempt_[group][index];
}

// The exempt parameters of a group go through step_group on their own, with a copy of the group whose "wd" is 0.
// Every gradient is checked first, so that a bad one cannot fail the second call after the first has updated.
// Sharded, the group's pieces are updated, those of no element (another process's) skipped.
void Optimizer::step_group_with_exemptions(std::size_t g, const std::vector<std::size_t>& counted) {
  std::vector<std::size_t> active;
  for (const auto i : counted)
    if (!sharded() || pieces_[g][i].numel() > 0) active.push_back(i);
  if (active.empty()) return;
  ParamGroup pieces;
  if (sharded()) pieces = stepped_group(g);
  auto& group = sharded() ? pieces : groups_[g];
  auto& state = states_[g];
  std::vector<std::size_t> decayed, exempt;
  for (const auto i : active) (exempt_[g][i] ? exempt : decayed).push_back(i);
  if (exempt.empty() || !group.hypers.contains("wd")) return step_group(group, state, active);
  check_grads(group, active, type().c_str());
  if (!decayed.empty()) step_group(group, state, decayed);
  ParamGroup without_wd = group;
  without_wd.hypers["wd"] = 0.0;
  state.exempt_pass = true;
  try {
    step_group(without_wd, state, exempt);
  } catch (...) {
    state.exempt_pass = false;
    throw;
  }
  state.exempt_pass = false;
}

ParamGroup Optimizer::stepped_group(std::size_t g) const { return {pieces_[g], groups_[g].hypers}; }

at::Tensor Optimizer::whole_state(std::size_t g, std::size_t i, const at::Tensor& piece) const {
  auto whole = at::zeros_like(groups_[g].params[i], at::MemoryFormat::Preserve);
  plan_.gather(whole, piece, plan_.ranges[g][i]);
  return whole;
}

void Optimizer::shard(ShardPlan plan) {
  const auto refuse = [&](const std::string& why) {
    throw ConfigError(fmt::format("{}: cannot step shards of the parameters (data parallel shard): {}", type(), why));
  };
  if (!elementwise())
    refuse(
        "its update of an element reads other elements (a norm of the parameter), so no process can update its "
        "share alone; use shard = \"none\"");
  if (device_hypers_) refuse("device hyper-parameters (captured CUDA-graph steps) are not sharded");
  if (!plan.gather) refuse("the plan has no gather");
  if (plan.ranges.size() != groups_.size() || (!plan.pieces.empty() && plan.pieces.size() != groups_.size()))
    refuse(fmt::format("the plan has {} groups, the optimizer {}", plan.ranges.size(), groups_.size()));
  at::NoGradGuard no_grad;
  std::vector<std::vector<at::Tensor>> pieces(groups_.size());
  for (std::size_t g = 0; g < groups_.size(); ++g) {
    const auto& params = groups_[g].params;
    if (plan.ranges[g].size() != params.size() || (!plan.pieces.empty() && plan.pieces.at(g).size() != params.size()))
      refuse(fmt::format("group {} has {} parameters, the plan {}", g, params.size(), plan.ranges[g].size()));
    for (std::size_t i = 0; i < params.size(); ++i) {
      const auto& p = params[i];
      const auto& r = plan.ranges[g][i];
      if (r.begin < 0 || r.numel < 0 || r.begin + r.numel > p.numel())
        refuse(fmt::format("parameter {} of group {} has {} elements, the plan gives this process [{}, {})", i, g,
                           p.numel(), r.begin, r.begin + r.numel));
      if (!p.is_non_overlapping_and_dense())
        refuse(fmt::format("parameter {} of group {} is not dense (its elements are not one block of memory)", i, g));
      if (plan.pieces.empty()) {
        pieces[g].push_back(memory_order(p.detach()).narrow(0, r.begin, r.numel));
        continue;
      }
      const auto& given = plan.pieces.at(g).at(i);
      if (!given.defined() || given.dim() != 1 || given.numel() != r.numel || given.scalar_type() != p.scalar_type())
        refuse(fmt::format("parameter {} of group {}: the plan's piece is {}, not {} elements of its dtype", i, g,
                           given.defined() ? fmt::format("[{}]", fmt::join(given.sizes(), ", ")) : "undefined",
                           r.numel));
      pieces[g].push_back(given);
    }
  }
  plan.pieces.clear();                             // held as pieces_
  if (sharded() && plan_.ranges == plan.ranges) {  // the same parts: the state stays, the pieces are made anew
    plan_ = std::move(plan);
    pieces_ = std::move(pieces);
    return;
  }
  // Each state tensor in turn: whole (gathered from an earlier plan's pieces, or as it is), then this process's piece.
  // A piece of no element is never stepped, so its state stays undefined: every list is sized for every parameter.
  const auto names = state_names();
  std::vector<GroupState> states = states_;
  for (std::size_t g = 0; g < groups_.size(); ++g) {
    const auto& params = groups_[g].params;
    for (const auto& name : names) states[g].tensors[name].resize(params.size());
    for (std::size_t i = 0; i < params.size(); ++i) {
      if (states[g].steps[i] == 0) continue;
      for (const auto& name : names) {
        auto& t = states[g].tensors.at(name).at(i);
        auto whole = sharded() ? whole_state(g, i, t) : t;
        if (!same_layout(whole, params[i]) || whole.device() != params[i].device())
          whole = at::empty_like(params[i], at::MemoryFormat::Preserve).copy_(whole);
        const auto& r = plan.ranges[g][i];
        t = memory_order(whole).narrow(0, r.begin, r.numel).clone();
      }
    }
  }
  states_ = std::move(states);
  plan_ = std::move(plan);
  pieces_ = std::move(pieces);
}

void Optimizer::unshard() {
  if (!sharded()) return;
  const auto names = state_names();
  std::vector<GroupState> states = states_;
  for (std::size_t g = 0; g < groups_.size(); ++g)
    for (std::size_t i = 0; i < groups_[g].params.size(); ++i) {
      if (states[g].steps[i] == 0) continue;
      for (const auto& name : names) {
        auto& t = states[g].tensors.at(name).at(i);
        t = whole_state(g, i, t);
      }
    }
  states_ = std::move(states);
  plan_ = {};
  pieces_.clear();
}

at::Tensor& Optimizer::shard_piece(std::size_t group, std::size_t index) {
  if (!sharded() || group >= pieces_.size() || index >= pieces_[group].size())
    throw Error(fmt::format("{}::shard_piece({}, {}): {}", type(), group, index,
                            sharded() ? "no such parameter" : "the optimizer is not sharded"));
  return pieces_[group][index];
}

void Optimizer::step() {
  at::NoGradGuard no_grad;
  if (groups_.size() != states_.size())
    throw ConfigError(
        fmt::format("Optimizer::step: the optimizer was made with {} parameter groups and now has {}; "
                    "create a new optimizer for a different split",
                    states_.size(), groups_.size()));
  for (std::size_t g = 0; g < groups_.size(); ++g)
    if (groups_[g].params.size() != states_[g].steps.size())
      throw ConfigError(
          fmt::format("Optimizer::step: parameter group {} was made with {} parameters and now has {}; "
                      "create a new optimizer for a different set of parameters",
                      g, states_[g].steps.size(), groups_[g].params.size()));
  std::vector<std::size_t> active;
  for (std::size_t g = 0; g < groups_.size(); ++g) {
    const auto& params = groups_[g].params;
    active.clear();
    for (std::size_t i = 0; i < params.size(); ++i)
      if ((sharded() ? pieces_[g][i] : params[i]).grad().defined()) active.push_back(i);
    auto& st = states_[g];
    st.last_active = active;
    if (active.empty()) continue;
    if (device_hypers_) make_device_state(g);  // from the counts before this step
    float* steps_f = st.step_tensor.data_ptr<float>();
    for (const auto i : active) steps_f[i] = static_cast<float>(++st.steps[i]);
    st.device_step_views.clear();     // last step's counts
    std::vector<at::Tensor> counted;  // device_hypers: the device counts this step advanced
    try {
      follow_params(sharded() ? pieces_[g] : params, st, active);
      if (device_hypers_) {
        if (!stream_capturing(params[active.front()].device())) stage_group(g);
        for (const auto i : active) counted.push_back(st.device_steps[i]);
        at::_foreach_add_(counted, 1.0);
      }
      step_group_with_exemptions(g, active);
    } catch (...) {
      // Subclasses validate before they touch anything, so undoing the counts restores the state.
      for (const auto i : active) steps_f[i] = static_cast<float>(--st.steps[i]);
      if (!counted.empty()) at::_foreach_add_(counted, -1.0);
      throw;
    }
  }
  ++step_count_;
  if (sharded() && plan_.gather_params) plan_.gather_params();
}

void Optimizer::set_device_hypers(bool on) {
  if (on && sharded())
    throw ConfigError(fmt::format("{}: device hyper-parameters (captured CUDA-graph steps) are not sharded", type()));
  if (on) {
    // A factor rounded to bfloat16 or float16 would change the update (1 - lr*wd becomes 1): the host path computes
    // those parameters' updates in float32, the device path in their own dtype.
    for (std::size_t g = 0; g < groups_.size(); ++g)
      for (std::size_t i = 0; i < groups_[g].params.size(); ++i) {
        const auto dtype = groups_[g].params[i].scalar_type();
        if (dtype != at::kFloat && dtype != at::kDouble)
          throw ConfigError(
              fmt::format("{}: device hyper-parameters need float32 or float64 parameters; parameter {} "
                          "of group {} is {} (keep the weights in float32 and train in mixed precision)",
                          type(), i, g, c10::toString(dtype)));
      }
  }
  device_hypers_ = on;
  if (on) return;
  for (auto& st : states_) {
    st.hypers_on_device = st.steps_on_device = at::Tensor();
    st.hyper_names.clear();
    st.hyper_views.clear();
    st.device_steps.clear();
  }
}

// Made at the first step with device_hypers, and again when the parameters moved to another device or a checkpoint
// replaced the state; the counts start from the host's, which are always current.
void Optimizer::make_device_state(std::size_t g) {
  auto& st = states_[g];
  const auto& params = groups_[g].params;
  const auto device = params.front().device();
  for (const auto& p : params)
    if (p.device() != device)
      throw ConfigError(
          fmt::format("{}: device hyper-parameters need each group's parameters on one device; group {} "
                      "has parameters on {} and on {}",
                      type(), g, device.str(), p.device().str()));
  if (st.hypers_on_device.defined() && st.hypers_on_device.device() == device) return;
  if (stream_capturing(device))
    throw Error(
        fmt::format("{}: the device hyper-parameters of group {} must exist before a step is captured; run "
                    "a step without capture first",
                    type(), g));
  st.hyper_names = keys_of(groups_[g].hypers);
  st.hypers_on_device = at::zeros({static_cast<std::int64_t>(st.hyper_names.size()) + 1},
                                  at::TensorOptions().dtype(at::kDouble).device(device));
  st.hyper_views.clear();
  for (std::int64_t k = 0; k < st.hypers_on_device.size(0); ++k)
    st.hyper_views.push_back(st.hypers_on_device.select(0, k));
  st.steps_on_device = st.step_tensor.to(device, /*non_blocking=*/false, /*copy=*/true);  // never the host counts
  st.device_steps.clear();
  for (std::int64_t i = 0; i < st.steps_on_device.size(0); ++i)
    st.device_steps.push_back(st.steps_on_device.select(0, i));
  stage_group(g);
}

void Optimizer::stage_group(std::size_t g) {
  auto& st = states_[g];
  if (!st.hypers_on_device.defined()) return;
  const auto& hypers = groups_[g].hypers;
  const bool to_gpu = !st.hypers_on_device.is_cpu();
  // Pinned memory, so that the copy does not wait for the host; the caching host allocator keeps each buffer until
  // its copy has run, so the next step's values never overwrite this step's in flight.
  auto host = at::empty({st.hypers_on_device.size(0)}, at::TensorOptions().dtype(at::kDouble).pinned_memory(to_gpu));
  auto* values = host.data_ptr<double>();
  for (std::size_t k = 0; k < st.hyper_names.size(); ++k) values[k] = hypers.at(st.hyper_names[k]);
  values[st.hyper_names.size()] = 0.0;
  st.hypers_on_device.copy_(host, /*non_blocking=*/to_gpu);
}

void Optimizer::stage_hypers() {
  if (!device_hypers_) return;
  for (std::size_t g = 0; g < groups_.size(); ++g) stage_group(g);
}

std::vector<std::vector<std::size_t>> Optimizer::last_updated() const {
  std::vector<std::vector<std::size_t>> updated;
  for (const auto& st : states_) updated.push_back(st.last_active);
  return updated;
}

void Optimizer::count_replayed_step(const std::vector<std::vector<std::size_t>>& updated) {
  if (updated.size() != states_.size())
    throw Error(fmt::format("Optimizer::count_replayed_step: {} groups given, the optimizer has {}", updated.size(),
                            states_.size()));
  for (std::size_t g = 0; g < states_.size(); ++g) {
    auto& st = states_[g];
    float* steps_f = st.step_tensor.data_ptr<float>();
    for (const auto i : updated[g]) {
      if (i >= st.steps.size())
        throw Error(fmt::format("Optimizer::count_replayed_step: no parameter {} in group {}", i, g));
      steps_f[i] = static_cast<float>(++st.steps[i]);
    }
  }
  ++step_count_;
}

std::string Optimizer::never_updated_trainable() const {
  for (std::size_t g = 0; g < groups_.size(); ++g)
    for (std::size_t i = 0; i < groups_[g].params.size(); ++i)
      if (groups_[g].params[i].requires_grad() && states_[g].steps[i] == 0)
        return fmt::format("parameter {} of group {}", i, g);
  return {};
}

NamedTensors Optimizer::device_hyper_tensors() const {
  NamedTensors out;
  for (std::size_t g = 0; g < states_.size(); ++g) {
    if (!states_[g].hypers_on_device.defined()) continue;
    out.emplace_back(fmt::format("{}.hypers", g), states_[g].hypers_on_device);
    out.emplace_back(fmt::format("{}.steps", g), states_[g].steps_on_device);
  }
  return out;
}

void Optimizer::append_state_addresses(std::vector<const void*>& out) const {
  for (const auto& st : states_) {
    out.push_back(st.hypers_on_device.defined() ? st.hypers_on_device.data_ptr() : nullptr);
    out.push_back(st.steps_on_device.defined() ? st.steps_on_device.data_ptr() : nullptr);
    for (const auto& [name, tensors] : st.tensors)
      for (const auto& t : tensors) out.push_back(t.defined() ? t.data_ptr() : nullptr);
  }
}

const at::Tensor& Optimizer::hyper_on_device(const GroupState& state, const char* name, const char* algorithm) {
  const auto zero = state.hyper_names.size();
  if (state.exempt_pass && std::string_view(name) == "wd") return state.hyper_views.at(zero);
  for (std::size_t k = 0; k < state.hyper_names.size(); ++k)
    if (state.hyper_names[k] == name) return state.hyper_views.at(k);
  throw ConfigError(
      fmt::format("{}: a parameter group has no hyper-parameter '{}' (it has: {}); keep the hypers the "
                  "optimizer was created with",
                  algorithm, name, fmt::join(state.hyper_names, ", ")));
}

// State loaded from a checkpoint takes its parameter's layout at load time; a callback may restride the model
// afterwards (ChannelsLast at before_fit), and a model may move to another device after its first steps (a
// Learner moved to the GPU, data parallel training moving it to the rank's GPU). Each state tensor follows its
// parameter again, values unchanged: a resumed run takes the same fused kernels, and so gets the same bits, as one
// never interrupted, and no step mixes devices.
void Optimizer::follow_params(const std::vector<at::Tensor>& params, GroupState& state,
                              const std::vector<std::size_t>& active) {
  for (auto& [name, tensors] : state.tensors) {
    for (const auto i : active) {
      if (i >= tensors.size() || !tensors[i].defined()) continue;
      const auto& p = params[i];
      auto& s = tensors[i];
      const bool restride = p.is_non_overlapping_and_dense() && s.sizes() == p.sizes() && !same_layout(s, p);
      if (restride)
        s = at::empty_like(p, at::MemoryFormat::Preserve).copy_(s);
      else if (s.device() != p.device())
        s = s.to(p.device());
    }
  }
}

void Optimizer::zero_grad(bool set_to_none) {
  for (auto& group : pieces_)
    for (auto& piece : group) piece.mutable_grad().reset();  // views of reduced gradients, set again each step
  std::vector<at::Tensor> to_zero;
  for (auto& group : groups_) {
    for (auto& p : group.params) {
      auto& g = p.mutable_grad();
      if (!g.defined()) continue;
      if (set_to_none) {
        g.reset();
        continue;
      }
      // A gradient made with create_graph=true is part of a graph: cut it loose before zeroing (as torch does).
      if (g.grad_fn())
        g = g.detach();
      else
        g.requires_grad_(false);
      to_zero.push_back(g);
    }
  }
  if (!to_zero.empty()) at::_foreach_zero_(to_zero);
}

double Optimizer::hyper(const std::string& name, std::size_t group) const {
  if (group >= groups_.size())
    throw ConfigError(fmt::format("Optimizer::hyper('{}', {}): there are only {} parameter groups", excerpt(name),
                                  group, groups_.size()));
  const auto& hypers = groups_[group].hypers;
  const auto it = hypers.find(name);
  if (it == hypers.end())
    throw ConfigError(fmt::format("Optimizer::hyper: parameter group {} has no hyper-parameter '{}' (it has: {})",
                                  group, excerpt(name), fmt::join(keys_of(hypers), ", ")));
  return it->second;
}

void Optimizer::set_hyper(const std::string& name, double value) { set_hyper(name, std::vector<double>{value}); }

void Optimizer::set_hyper(const std::string& name, const std::vector<double>& per_group) {
  if (per_group.size() != 1 && per_group.size() != groups_.size())
    throw ConfigError(
        fmt::format("Optimizer::set_hyper('{}'): got {} values for {} parameter groups; pass one value "
                    "for all groups or one per group",
                    excerpt(name), per_group.size(), groups_.size()));
  for (std::size_t g = 0; g < groups_.size(); ++g) {
    if (!groups_[g].hypers.contains(name))
      throw ConfigError(fmt::format("Optimizer::set_hyper: {} has no hyper-parameter '{}' (group {} has: {})", type(),
                                    excerpt(name), g, fmt::join(keys_of(groups_[g].hypers), ", ")));
    check_finite(name, per_group.size() == 1 ? per_group[0] : per_group[g], fmt::format("set_hyper, group {}", g));
  }
  for (std::size_t g = 0; g < groups_.size(); ++g)
    groups_[g].hypers[name] = per_group.size() == 1 ? per_group[0] : per_group[g];
}

NamedTensors Optimizer::state_tensors() const {
  NamedTensors out;
  for (const auto& d : deferred_state_tensors()) out.emplace_back(d.name, d.make());
  return out;
}

std::vector<DeferredTensor> Optimizer::deferred_state_tensors() const {
  std::vector<DeferredTensor> out;
  const auto names = state_names();
  for (std::size_t g = 0; g < groups_.size(); ++g) {
    const auto& st = states_[g];
    for (std::size_t i = 0; i < st.steps.size(); ++i) {
      if (st.steps[i] == 0) continue;
      const auto& p = groups_[g].params[i];
      for (const auto& name : names) {
        const auto& t = st.tensors.at(name).at(i);
        out.push_back({.name = state_name(g, i, name),
                       .dtype = p.scalar_type(),
                       .shape = p.sizes().vec(),
                       .make = [this, g, i, t] { return sharded() ? whole_state(g, i, t) : t; }});
      }
    }
  }
  return out;
}

NamedTensors Optimizer::held_state_tensors() const {
  NamedTensors out;
  const auto names = state_names();
  for (std::size_t g = 0; g < groups_.size(); ++g) {
    const auto& st = states_[g];
    for (std::size_t i = 0; i < st.steps.size(); ++i) {
      if (st.steps[i] == 0) continue;
      for (const auto& name : names) {
        const auto it = st.tensors.find(name);
        if (it != st.tensors.end() && i < it->second.size() && it->second[i].defined())
          out.emplace_back(state_name(g, i, name), it->second[i]);
      }
    }
  }
  return out;
}

std::string Optimizer::state_json() const {
  nlohmann::json groups = nlohmann::json::array();
  for (std::size_t g = 0; g < groups_.size(); ++g) {
    nlohmann::json hypers = nlohmann::json::object();
    for (const auto& [k, v] : groups_[g].hypers) hypers[k] = v;
    groups.push_back({{"hypers", hypers}, {"steps", states_[g].steps}});
  }
  return nlohmann::json{{"type", type()}, {"step_count", step_count_}, {"groups", groups}}.dump();
}

void Optimizer::load_state(const NamedTensors& tensors, const std::string& json) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(json);
  } catch (const nlohmann::json::exception& e) {
    load_fail(fmt::format("the state JSON does not parse ({}); pass the string state_json() returned",
                          excerpt(e.what(), 256)));
  }
  if (!j.is_object() || !j.contains("type") || !j.contains("step_count") || !j.contains("groups") ||
      !j["type"].is_string() || !j["step_count"].is_number_integer() || !j["groups"].is_array())
    load_fail("the state JSON lacks \"type\", \"step_count\" or \"groups\"; pass the string state_json() returned");
  if (j["type"].get<std::string>() != type())
    load_fail(
        fmt::format("the checkpoint holds the state of {} but this optimizer is {}; create the optimizer the "
                    "checkpoint was made with",
                    excerpt(j["type"].get<std::string>()), type()));
  const auto step_count = j["step_count"].get<std::int64_t>();
  if (step_count < 0) load_fail(fmt::format("step_count is {}", step_count));
  const auto& jgroups = j["groups"];
  if (jgroups.size() != groups_.size())
    load_fail(
        fmt::format("the checkpoint has {} parameter groups, this optimizer {}; split the model the same way as "
                    "when it was saved",
                    jgroups.size(), groups_.size()));

  // Everything is built aside and swapped in at the end, so a failed load leaves the optimizer as it was.
  std::vector<Hypers> hypers(groups_.size());
  std::vector<GroupState> states(groups_.size());
  const auto names = state_names();
  for (std::size_t g = 0; g < groups_.size(); ++g) {
    const auto& jg = jgroups[g];
    const auto n = groups_[g].params.size();
    if (!jg.is_object() || !jg.contains("hypers") || !jg.contains("steps") || !jg["hypers"].is_object() ||
        !jg["steps"].is_array())
      load_fail(fmt::format("group {} of the state JSON lacks \"hypers\" or \"steps\"", g));
    if (jg["steps"].size() != n)
      load_fail(fmt::format("group {} has {} parameters in the checkpoint but {} here; build the same model and groups",
                            g, jg["steps"].size(), n));
    for (const auto& [k, v] : jg["hypers"].items()) {
      if (!v.is_number()) load_fail(fmt::format("hyper-parameter '{}' of group {} is not a number", excerpt(k), g));
      hypers[g][k] = v.get<double>();
    }
    if (keys_of(hypers[g]) != keys_of(groups_[g].hypers))
      load_fail(fmt::format("group {} has hyper-parameters [{}] in the checkpoint but [{}] here", g,
                            fmt::join(excerpts(keys_of(hypers[g])), ", "),
                            fmt::join(keys_of(groups_[g].hypers), ", ")));
    auto& st = states[g];
    for (std::size_t i = 0; i < n; ++i) {
      const auto& s = jg["steps"][i];
      if (!s.is_number_integer() || s.get<std::int64_t>() < 0)
        load_fail(fmt::format("the step count of parameter {} of group {} is not a count", i, g));
      st.steps.push_back(s.get<std::int64_t>());
    }
    st.step_tensor = at::zeros({static_cast<std::int64_t>(n)}, at::kFloat);
    for (std::size_t i = 0; i < n; ++i) {
      st.step_tensor.data_ptr<float>()[i] = static_cast<float>(st.steps[i]);
      st.step_views.push_back(st.step_tensor.select(0, static_cast<std::int64_t>(i)));
    }
    for (const auto& name : names) st.tensors[name].resize(n);
  }

  at::NoGradGuard no_grad;
  std::set<std::string> loaded;
  for (const auto& [name, t] : tensors) {
    // "<group>.<index>.<state name>"
    const auto dot1 = name.find('.');
    const auto dot2 = dot1 == std::string::npos ? std::string::npos : name.find('.', dot1 + 1);
    const auto g = dot1 == std::string::npos ? std::nullopt : parse_index(std::string_view(name).substr(0, dot1));
    const auto i = dot2 == std::string::npos ? std::nullopt
                                             : parse_index(std::string_view(name).substr(dot1 + 1, dot2 - dot1 - 1));
    const auto what = dot2 == std::string::npos ? std::string() : name.substr(dot2 + 1);
    const bool known = g && i && *g < groups_.size() && *i < groups_[*g].params.size() &&
                       std::find(names.begin(), names.end(), what) != names.end() && states[*g].steps[*i] > 0;
    if (!known)
      load_fail(
          fmt::format("unexpected state tensor '{}': {} keeps [{}] per updated parameter, named "
                      "\"<group>.<index>.<state>\"; the checkpoint was made by a different optimizer or model",
                      excerpt(name), type(), fmt::join(names, ", ")));
    if (!loaded.insert(name).second) load_fail(fmt::format("state tensor '{}' appears twice", excerpt(name)));
    const auto& p = groups_[*g].params[*i];
    if (!t.defined()) load_fail(fmt::format("state tensor '{}' is undefined", excerpt(name)));
    if (t.scalar_type() != p.scalar_type())
      load_fail(
          fmt::format("state tensor '{}' has dtype {} but its parameter has {}; convert the model to the dtype it "
                      "was trained with before loading",
                      excerpt(name), c10::toString(t.scalar_type()), c10::toString(p.scalar_type())));
    if (t.sizes() != p.sizes())
      load_fail(fmt::format("state tensor '{}' has shape {} but its parameter has shape {}", excerpt(name), shape_of(t),
                            shape_of(p)));
    auto whole = at::empty_like(p, at::MemoryFormat::Preserve).copy_(t.detach());
    if (sharded()) {
      const auto& r = plan_.ranges[*g][*i];
      whole = memory_order(whole).narrow(0, r.begin, r.numel).clone();  // this process's piece
    }
    states[*g].tensors[what][*i] = std::move(whole);
  }
  for (std::size_t g = 0; g < groups_.size(); ++g)
    for (std::size_t i = 0; i < states[g].steps.size(); ++i)
      if (states[g].steps[i] > 0)
        for (const auto& name : names)
          if (!states[g].tensors[name][i].defined())
            load_fail(fmt::format("missing state tensor '{}' (parameter {} of group {} was updated {} times)",
                                  state_name(g, i, name), i, g, states[g].steps[i]));

  for (std::size_t g = 0; g < groups_.size(); ++g) groups_[g].hypers = std::move(hypers[g]);
  states_ = std::move(states);
  step_count_ = step_count;
}

}  // namespace fastlearn
