#include <fastlearn/distributed/detail/sharded_units.h>

#include <fastlearn/comm/collectives.h>
#include <fastlearn/comm/group.h>
#include <fastlearn/comm/runtime.h>
#include <fastlearn/core/error.h>
#include <fastlearn/distributed/detail/sharded_step.h>
#include <fastlearn/models/torchscript.h>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <fnmatch.h>
#include <torch/torch.h>

#include <atomic>
#include <mutex>
#include <unordered_map>

namespace fastlearn {

namespace {

namespace nn = torch::nn;

// The hooks of a backward may outlive the fit whose units they belong to (a graph kept by an error): they find their
// units here by number, and do nothing once those are gone.
std::mutex registry_mutex;
std::unordered_map<std::int64_t, ShardedUnits*> registry;
std::atomic<std::int64_t> next_id{1};

ShardedUnits* find_units(std::int64_t id) {
  std::lock_guard lock(registry_mutex);
  const auto it = registry.find(id);
  return it == registry.end() ? nullptr : it->second;
}

// Stands in a Sequential for one of its entries: the same children, parameters and buffers under the same names (the
// model's state dict does not change), and a forward that runs the entry between the unit's gather and release.
class ShardedUnitImpl : public nn::Module {
 public:
  ShardedUnitImpl(std::shared_ptr<nn::Module> inner, nn::AnyModule entry, ShardedUnits& units, std::size_t index)
      : nn::Module(inner->name()), inner_(std::move(inner)), entry_(std::move(entry)), units_(units), index_(index) {
    for (const auto& c : inner_->named_children()) register_module(c.key(), c.value());
    for (const auto& p : inner_->named_parameters(/*recurse=*/false))
      register_parameter(p.key(), p.value(), p.value().requires_grad());
    for (const auto& b : inner_->named_buffers(/*recurse=*/false)) register_buffer(b.key(), b.value());
  }
  at::Tensor forward(const at::Tensor& x) { return units_.run(index_, x); }
  at::Tensor run_entry(const at::Tensor& x) { return entry_.forward<at::Tensor>(x); }
  void train(bool on) override {
    nn::Module::train(on);
    inner_->train(on);
  }
  void pretty_print(std::ostream& stream) const override { inner_->pretty_print(stream); }

 private:
  std::shared_ptr<nn::Module> inner_;
  nn::AnyModule entry_;
  ShardedUnits& units_;
  std::size_t index_;
};

// The AnyModule a Sequential runs for entry `i` (what operator[] does not give).
nn::AnyModule& entry_at(nn::SequentialImpl& seq, std::size_t i) {
  return *(seq.begin() + static_cast<std::ptrdiff_t>(i));
}

std::vector<std::string> split_path(const std::string& path) {
  std::vector<std::string> parts;
  std::size_t start = 0;
  for (;;) {
    const auto dot = path.find('.', start);
    parts.push_back(path.substr(start, dot == std::string::npos ? std::string::npos : dot - start));
    if (dot == std::string::npos) return parts;
    start = dot + 1;
  }
}

// Name by name: a '*' in a name of the pattern stands for any characters of that name ("layer*" for "layer1").
bool matches(const std::string& pattern, const std::string& path) {
  const auto want = split_path(pattern), have = split_path(path);
  if (want.size() != have.size()) return false;
  for (std::size_t i = 0; i < want.size(); ++i)
    if (fnmatch(want[i].c_str(), have[i].c_str(), 0) != 0) return false;
  return true;
}

}  // namespace

struct ShardedUnits::Unit {
  std::string name;
  nn::SequentialImpl* parent = nullptr;
  std::size_t entry = 0;  ///< its index in the parent
  std::string key;        ///< its child name in the parent
  nn::AnyModule original;
  std::shared_ptr<nn::Module> original_ptr;
  std::shared_ptr<ShardedUnitImpl> wrapper;
  std::vector<at::Tensor> params;
};

ShardedUnits::ShardedUnits(nn::Module& model, const std::vector<std::string>& names, Group& group,
                           bool reshard_after_forward, bool prefetch)
    : group_(group), reshard_after_forward_(reshard_after_forward), prefetch_(prefetch) {
  const auto modules = model.named_modules("", /*include_self=*/false);
  const auto module_at = [&](const std::string& path) -> nn::Module* {
    if (path.empty()) return &model;
    const auto* found = modules.find(path);
    return found ? found->get() : nullptr;
  };
  // Candidate units: (path, parent Sequential, entry index).
  struct Slot {
    std::string path;
    nn::SequentialImpl* parent;
    std::size_t entry;
  };
  std::vector<Slot> slots;
  const auto entries_of = [&](const std::string& prefix, nn::SequentialImpl& seq) {
    for (std::size_t i = 0; i < seq.size(); ++i)
      if (!seq.ptr(i)->parameters().empty())
        slots.push_back({prefix.empty() ? std::to_string(i) : prefix + "." + std::to_string(i), &seq, i});
  };
  if (dynamic_cast<models::TorchScriptImpl*>(&model)) {
    throw ConfigError(
        "shard = \"parameters\": the model is a TorchScript module, whose forward calls its own submodules: none can "
        "be wrapped as a unit (shard_units) to gather its parameters; shard = \"optimizer\" or \"gradients\" train it "
        "sharded");
  }
  if (names.empty()) {
    if (auto* seq = dynamic_cast<nn::SequentialImpl*>(&model)) {
      entries_of("", *seq);
    } else {
      for (const auto& child : model.named_children())
        if (auto* inner = dynamic_cast<nn::SequentialImpl*>(child.value().get())) entries_of(child.key(), *inner);
    }
    if (slots.empty())
      throw ConfigError(fmt::format(
          "shard = \"parameters\": the model ({}) is not a Sequential and holds none whose entries have parameters, so "
          "it has no default units; name them with shard_units (entries of Sequentials inside it, e.g. \"blocks.*\")",
          model.name()));
  } else {
    for (const auto& pattern : names) {
      bool found = false;
      for (const auto& item : modules) {
        if (!matches(pattern, item.key())) continue;
        const auto& path = item.key();
        const auto dot = path.rfind('.');
        const auto parent_path = dot == std::string::npos ? std::string() : path.substr(0, dot);
        auto* parent = dynamic_cast<nn::SequentialImpl*>(module_at(parent_path));
        std::optional<std::size_t> entry;
        for (std::size_t i = 0; parent && i < parent->size(); ++i)
          if (parent->ptr(i).get() == item.value().get()) entry = i;
        if (!entry && pattern.find('*') != std::string::npos) continue;  // a pattern takes the entries it matches
        if (!entry)
          throw ConfigError(fmt::format(
              "shard_units: '{}' ({}) is not an entry of a Sequential, so it cannot be wrapped (LibTorch modules have "
              "no hooks: a unit's forward is run by its Sequential); name entries of Sequentials, e.g. '{}.*' for "
              "those of a Sequential '{}'",
              path, item.value()->name(), path, path));
        found = true;
        if (!item.value()->parameters().empty()) slots.push_back({path, parent, *entry});
      }
      if (!found)
        throw ConfigError(fmt::format("shard_units: '{}' names no {}module of the model ({})", pattern,
                                      pattern.find('*') != std::string::npos ? "Sequential entry among the " : "",
                                      model.name()));
    }
    if (slots.empty())
      throw ConfigError(fmt::format("shard_units: [{}] name no module with parameters", fmt::join(names, ", ")));
  }
  // No unit inside another, no parameter in two.
  std::unordered_map<const c10::TensorImpl*, std::size_t> owner;
  for (std::size_t u = 0; u < slots.size(); ++u) {
    for (std::size_t v = 0; v < slots.size(); ++v)
      if (u != v && slots[v].path.starts_with(slots[u].path + "."))
        throw ConfigError(fmt::format("shard_units: unit '{}' is inside unit '{}'; name one or the other",
                                      slots[v].path, slots[u].path));
    auto unit = std::make_unique<Unit>();
    unit->name = slots[u].path;
    unit->parent = slots[u].parent;
    unit->entry = slots[u].entry;
    unit->original = entry_at(*slots[u].parent, slots[u].entry);
    unit->original_ptr = slots[u].parent->ptr(slots[u].entry);
    for (const auto& child : slots[u].parent->named_children())
      if (child.value().get() == unit->original_ptr.get()) unit->key = child.key();
    for (const auto& p : unit->original_ptr->named_parameters()) {
      const auto [it, fresh] = owner.try_emplace(p.value().unsafeGetTensorImpl(), u);
      if (!fresh && it->second != u)
        throw ConfigError(fmt::format(
            "shard = \"parameters\": units '{}' and '{}' share a parameter ('{}' of the second): a tied parameter "
            "must stay in one unit; put both users in one unit (shard_units)",
            slots[it->second].path, slots[u].path, p.key()));
      if (fresh) unit->params.push_back(p.value());
    }
    units_.push_back(std::move(unit));
  }
  // A unit's parameter used outside every unit (a weight tied to a head that is no unit) would be read there while
  // its memory is freed.
  for (const auto& p : model.named_parameters()) {
    const auto it = owner.find(p.value().unsafeGetTensorImpl());
    if (it == owner.end()) continue;
    const auto& unit = slots[it->second].path;
    if (p.key().starts_with(unit + ".")) continue;
    throw ConfigError(fmt::format(
        "shard = \"parameters\": '{}' is a parameter of unit '{}', and is also used outside every unit: a tied "
        "parameter must stay in one unit; make a unit that holds both users (shard_units)",
        p.key(), unit));
  }
  backward_pending_.assign(units_.size(), false);
  id_ = next_id++;
  {
    std::lock_guard lock(registry_mutex);
    registry.emplace(id_, this);
  }
  for (std::size_t u = 0; u < units_.size(); ++u) {
    auto& unit = *units_[u];
    unit.wrapper = std::make_shared<ShardedUnitImpl>(unit.original_ptr, unit.original, *this, u);
    entry_at(*unit.parent, unit.entry) = nn::AnyModule(unit.wrapper);
    if (!unit.key.empty()) unit.parent->replace_module(unit.key, unit.wrapper);
  }
}

ShardedUnits::~ShardedUnits() {
  {
    std::lock_guard lock(registry_mutex);
    registry.erase(id_);
  }
  for (auto& unit : units_) {
    entry_at(*unit->parent, unit->entry) = unit->original;
    if (!unit->key.empty()) unit->parent->replace_module(unit->key, unit->original_ptr);
  }
}

std::vector<std::vector<at::Tensor>> ShardedUnits::params() const {
  std::vector<std::vector<at::Tensor>> out;
  for (const auto& unit : units_) out.push_back(unit->params);
  return out;
}

std::int64_t ShardedUnits::unit_of(const at::Tensor& param) const {
  for (std::size_t u = 0; u < units_.size(); ++u)
    for (const auto& p : units_[u]->params)
      if (p.unsafeGetTensorImpl() == param.unsafeGetTensorImpl()) return static_cast<std::int64_t>(u);
  return -1;
}

void ShardedUnits::start(ShardedStep& step) { step_ = &step; }

void ShardedUnits::release_all() {
  read_unit_ = -1;
  backward_pending_.assign(units_.size(), false);
  if (!step_) return;
  for (std::size_t u = 0; u < units_.size(); ++u) step_->release_unit(u);
}

void ShardedUnits::check_same_unit(std::size_t u) {
  if (device_of(group_).is_cuda()) return;  // it would make the host wait for the GPU: NCCL ranks go without it
  auto mine = torch::full({1}, static_cast<std::int64_t>(u), torch::kLong);
  auto all = torch::empty({group_.size()}, torch::kLong);
  all_gather_into(all, mine, &group_);
  const auto* seen = all.data_ptr<std::int64_t>();
  for (int r = 0; r < group_.size(); ++r) {
    if (seen[r] == static_cast<std::int64_t>(u)) continue;
    const auto other = static_cast<std::size_t>(seen[r]);
    throw DistributedError(fmt::format(
        "rank {}: sharded parameters: this rank gathers unit '{}' for its forward where rank {} gathers unit '{}'; "
        "every rank must run the same units in the same order (a unit skipped, or run, on some ranks only)",
        group_.ranks()[static_cast<std::size_t>(group_.rank())], units_[u]->name,
        group_.ranks()[static_cast<std::size_t>(r)], other < units_.size() ? units_[other]->name : "?"));
  }
}

at::Tensor ShardedUnits::run(std::size_t u, const at::Tensor& x) {
  auto& unit = *units_.at(u);
  if (!step_) return unit.wrapper->run_entry(x);
  if (read_unit_ == static_cast<std::int64_t>(u)) read_unit_ = -1;  // now the forward's
  check_same_unit(u);
  step_->gather_unit(u);
  if (prefetch_ && u + 1 < units_.size()) step_->prefetch_unit(u + 1);
  const bool grad = at::GradMode::is_enabled();
  const auto id = id_;
  // The gradient of the input is complete once the unit's backward is done: its parameters can go.
  if (grad && x.requires_grad())
    x.register_hook([id, u](const at::Tensor&) {
      if (auto* units = find_units(id)) units->after_unit_backward(u);
    });
  auto out = unit.wrapper->run_entry(x);
  const bool backward = grad && out.requires_grad();
  backward_pending_[u] = backward;
  // The unit's backward starts when the gradient of its output is there: its parameters are gathered again first.
  if (backward)
    out.register_hook([id, u](const at::Tensor&) {
      if (auto* units = find_units(id)) units->before_unit_backward(u);
    });
  // The last unit's backward comes right after the loss: kept rather than gathered again.
  if (!backward || (reshard_after_forward_ && u + 1 < units_.size())) step_->release_unit(u);
  return out;
}

void ShardedUnits::before_unit_backward(std::size_t u) {
  if (!step_) return;
  backward_pending_[u] = false;
  step_->gather_unit(u);
  // The unit before runs its backward next (when it has one): its gather can start now.
  if (prefetch_ && u > 0 && backward_pending_[u - 1]) step_->prefetch_unit(u - 1);
}

void ShardedUnits::after_unit_backward(std::size_t u) {
  if (step_) step_->release_unit(u);
}

at::Tensor ShardedUnits::whole(const at::Tensor& t) {
  if (!step_) return t;
  const auto u = unit_of(t);
  if (u < 0) return t;
  if (read_unit_ >= 0 && read_unit_ != u) step_->release_unit(static_cast<std::size_t>(read_unit_));
  step_->gather_unit(static_cast<std::size_t>(u));
  read_unit_ = u;
  return t.detach();
}

}  // namespace fastlearn
