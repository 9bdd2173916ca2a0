#include <fastlearn/distributed/detail/sharded_step.h>

#include <fastlearn/comm/collectives.h>
#include <fastlearn/comm/group.h>
#include <fastlearn/comm/pending_works.h>
#include <fastlearn/comm/process_group.h>
#include <fastlearn/core/detail/memory_order.h>
#include <fastlearn/core/error.h>
#include <fastlearn/distributed/grad_reducer.h>
#include <fastlearn/optim/optimizer.h>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/torch.h>

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <limits>
#include <unordered_map>
#include <unordered_set>

namespace fastlearn {

namespace {

// A unit's parameters are views of its flat buffer's storage: freeing the storage's memory frees theirs, and giving
// it memory again gives it back to every view (the tensors stay the same objects, for the model, the optimizer and
// what autograd saved for backward).
void release_memory(const at::Tensor& flat) {
  auto* storage = flat.storage().unsafeGetStorageImpl();
  storage->set_data_ptr_noswap(c10::DataPtr(nullptr, flat.device()));
  storage->set_nbytes(0);
}

void allocate_memory(const at::Tensor& flat) {
  auto* storage = flat.storage().unsafeGetStorageImpl();
  const auto bytes = static_cast<std::size_t>(flat.numel()) * flat.element_size();
  storage->set_data_ptr_noswap(storage->allocator()->allocate(bytes));
  storage->set_nbytes(bytes);
}

}  // namespace

// Moves the bucket's parameters into one buffer (each in memory order at its offset, the padding zero): each
// parameter's tensor stays the same object (the model, the optimizer and the reducer keep it), only its storage moves.
void ShardedStep::flatten(Bucket& b) {
  torch::NoGradGuard no_grad;
  const auto& like = b.params.front();
  b.flat = at::empty({b.layout.padded}, like.options());
  b.flat.narrow(0, b.layout.numel, b.layout.padded - b.layout.numel).zero_();
  for (std::size_t j = 0; j < b.params.size(); ++j) {
    auto& p = b.params[j];
    if (!p.is_non_overlapping_and_dense())
      throw ConfigError(fmt::format(
          "sharded training: a parameter of shape [{}] and strides [{}] is not dense (its elements are not one block "
          "of memory), so it cannot be split into shares; make it contiguous, or use shard = \"none\"",
          fmt::join(p.sizes(), ", "), fmt::join(p.strides(), ", ")));
    if (p.scalar_type() != like.scalar_type() || p.device() != like.device())
      throw ConfigError(fmt::format(
          "sharded training: parameters of {} on {} and of {} on {} would share one buffer{}; keep a unit's "
          "parameters in one dtype on one device",
          c10::toString(like.scalar_type()), like.device().str(), c10::toString(p.scalar_type()), p.device().str(),
          b.unit >= 0 ? fmt::format(" (unit {})", b.unit) : std::string()));
    const auto offset = b.layout.param_offsets[j];
    b.flat.narrow(0, offset, p.numel()).copy_(memory_order(p.detach()));
    p.set_(b.flat.storage(), b.flat.storage_offset() + offset, p.sizes(), p.strides());
  }
}

void ShardedStep::shard_optimizer(State& state, Optimizer& opt) {
  std::unordered_map<const c10::TensorImpl*, std::pair<std::size_t, std::size_t>> where;
  bool units = false;
  for (const auto& b : state.buckets) units = units || b.share.defined();  // stage 3: pieces are the shares
  ShardPlan plan;
  for (std::size_t g = 0; g < opt.param_groups().size(); ++g) {
    const auto& params = opt.param_groups()[g].params;
    plan.ranges.emplace_back(params.size());
    if (units) {
      auto& pieces = plan.pieces.emplace_back();
      for (const auto& p : params) pieces.push_back(at::empty({0}, p.options()));
    }
    for (std::size_t i = 0; i < params.size(); ++i) where.emplace(params[i].unsafeGetTensorImpl(), std::pair{g, i});
  }
  const auto me = static_cast<std::size_t>(group_.rank());
  for (auto& b : state.buckets) {
    b.in_opt.clear();
    b.opt_index.clear();
    for (const auto& p : b.params) {
      const auto it = where.find(p.unsafeGetTensorImpl());
      b.in_opt.push_back(it != where.end());
      b.opt_index.push_back(it != where.end() ? it->second : std::pair<std::size_t, std::size_t>{0, 0});
    }
    for (const auto& piece : b.layout.pieces[me]) {
      if (!b.in_opt[piece.param]) continue;
      const auto [g, i] = b.opt_index[piece.param];
      plan.ranges[g][i] = {.begin = piece.param_offset, .numel = piece.numel};
      if (!units) continue;
      plan.pieces[g][i] = b.share.defined()
                              ? b.share.narrow(0, piece.part_offset, piece.numel)
                              : memory_order(b.params[piece.param].detach()).narrow(0, piece.param_offset, piece.numel);
    }
  }
  // The optimizer keeps the plan after this object (a fit's) is gone: the gather holds the group, which outlives it.
  plan.gather = [group = &group_](const at::Tensor& whole, const at::Tensor& piece, const ShardRange& range) {
    auto flat = memory_order(whole);
    if (range.numel > 0) flat.narrow(0, range.begin, range.numel).copy_(piece);
    all_reduce(flat, ReduceOp::sum, group);  // the others' elements are zeros here
  };
  plan.gather_params = [shared = state_, group = &group_] { gather_params(*shared, *group); };
  opt.shard(std::move(plan));
}

void ShardedStep::adopt(const GradReducer& reducer, Optimizer& opt) {
  auto state = std::make_shared<State>();
  for (auto& params : reducer.bucket_params()) {
    auto& b = state->buckets.emplace_back();
    std::vector<std::int64_t> numels;
    for (const auto& p : params) numels.push_back(p.numel());
    b.layout = shard_bucket(numels, group_.size());
    b.params = std::move(params);
    flatten(b);
  }
  state_ = std::move(state);
  shard_optimizer(*state_, opt);
}

void ShardedStep::adopt_units(GradReducer& reducer, Optimizer& opt,
                              const std::vector<std::vector<at::Tensor>>& unit_params) {
  auto state = std::make_shared<State>();
  std::unordered_map<const c10::TensorImpl*, std::int64_t> unit_of;
  for (std::size_t u = 0; u < unit_params.size(); ++u)
    for (const auto& p : unit_params[u]) unit_of.emplace(p.unsafeGetTensorImpl(), static_cast<std::int64_t>(u));
  std::unordered_set<const c10::TensorImpl*> reduced;
  for (auto& params : reducer.bucket_params()) {
    auto& b = state->buckets.emplace_back();
    const auto it = unit_of.find(params.front().unsafeGetTensorImpl());
    b.unit = it == unit_of.end() ? -1 : it->second;
    for (const auto& p : params) reduced.insert(p.unsafeGetTensorImpl());
    b.params = std::move(params);
  }
  for (std::size_t u = 0; u < unit_params.size(); ++u) {
    std::vector<at::Tensor> frozen;
    for (const auto& p : unit_params[u])
      if (!reduced.contains(p.unsafeGetTensorImpl())) frozen.push_back(p);
    if (frozen.empty()) continue;
    auto& b = state->buckets.emplace_back();
    b.unit = static_cast<std::int64_t>(u);
    b.reduced = false;
    b.params = std::move(frozen);
  }
  state->unit_buckets.resize(unit_params.size());
  state->unit_whole.assign(unit_params.size(), false);
  state->in_flight.resize(unit_params.size());
  const auto me = static_cast<std::int64_t>(group_.rank());
  for (std::size_t k = 0; k < state->buckets.size(); ++k) {
    auto& b = state->buckets[k];
    std::vector<std::int64_t> numels;
    for (const auto& p : b.params) numels.push_back(p.numel());
    b.layout = shard_bucket(numels, group_.size());
    flatten(b);
    if (b.unit < 0) continue;
    state->unit_buckets[static_cast<std::size_t>(b.unit)].push_back(k);
    b.share = b.flat.narrow(0, me * b.layout.part, b.layout.part).clone();
  }
  state_ = state;
  try {
    shard_optimizer(*state_, opt);
  } catch (...) {
    state_.reset();  // nothing freed yet: the parameters are whole, in their flat buffers
    throw;
  }
  for (std::size_t u = 0; u < state_->unit_buckets.size(); ++u)
    for (const auto k : state_->unit_buckets[u]) release_memory(state_->buckets[k].flat);
  reducer_ = &reducer;
  version_ = reducer.layout_version();
  opt_ = &opt;
}

bool ShardedStep::has_units() const { return state_ && !state_->unit_buckets.empty(); }

bool ShardedStep::unit_whole(std::size_t u) const { return state_->unit_whole.at(u); }

void ShardedStep::gather_unit(std::size_t u) {
  finish_prefetch(u);
  if (state_->unit_whole.at(u)) return;
  torch::NoGradGuard no_grad;
  for (const auto k : state_->unit_buckets[u]) {
    const auto& b = state_->buckets[k];
    allocate_memory(b.flat);
    all_gather_into(b.flat, b.share, &group_);
  }
  state_->unit_whole[u] = true;
}

void ShardedStep::prefetch_unit(std::size_t u) {
  if (state_->unit_whole.at(u)) return;
  torch::NoGradGuard no_grad;
  check_pending(group_);
  // Every buffer has memory before the first work starts, and the unit counts as whole (on its way) from then on, so
  // that nothing frees memory a started work writes, even when a later start fails.
  for (const auto k : state_->unit_buckets[u]) allocate_memory(state_->buckets[k].flat);
  state_->unit_whole[u] = true;
  auto& works = state_->in_flight[u];
  for (const auto k : state_->unit_buckets[u]) {
    const auto& b = state_->buckets[k];
    auto output = b.flat, input = b.share;
    const auto call = group_.next_call();
    try {
      works.emplace_back(group_.backend()._allgather_base(output, input), call);
    } catch (const std::exception& e) {
      throw DistributedError(fmt::format("rank {}: the prefetch of unit {}'s parameters could not start: {}",
                                         group_.ranks()[static_cast<std::size_t>(group_.rank())], u, error_text(e)));
    }
  }
}

void ShardedStep::finish_prefetch(std::size_t u) {
  auto& works = state_->in_flight.at(u);
  if (works.empty()) return;
  auto pending = std::move(works);
  works.clear();
  const auto mode = wait_mode(group_.kind());
  for (auto& [work, call] : pending) {
    const auto what = fmt::format("the prefetch of unit {}'s parameters", u);
    try {
      if (mode == WaitMode::stream) {
        work->wait();  // only the current stream waits
        group_.pending().add(work, what, call);
      } else {
        work->wait(group_.timeout());
      }
    } catch (const std::exception& e) {
      throw DistributedError(fmt::format("{} failed on rank {}: {}.{}", what,
                                         group_.ranks()[static_cast<std::size_t>(group_.rank())], error_text(e),
                                         silent_ranks(group_, call)));
    }
  }
}

void ShardedStep::release_unit(std::size_t u) {
  finish_prefetch(u);
  if (!state_->unit_whole.at(u)) return;
  for (const auto k : state_->unit_buckets[u]) release_memory(state_->buckets[k].flat);
  state_->unit_whole[u] = false;
}

void ShardedStep::make_whole(Optimizer& opt) {
  if (!has_units()) return;
  for (std::size_t u = 0; u < state_->unit_buckets.size(); ++u) gather_unit(u);
  for (auto& b : state_->buckets) {
    b.unit = -1;
    b.share = at::Tensor();
  }
  state_->unit_buckets.clear();
  state_->unit_whole.clear();
  state_->in_flight.clear();
  // The same ranges: the optimizer keeps its state and takes its pieces from the parameters' memory again.
  shard_optimizer(*state_, opt);
}

bool ShardedStep::abandon() {
  if (!has_units()) return false;
  torch::NoGradGuard no_grad;
  const auto me = static_cast<std::int64_t>(group_.rank());
  for (std::size_t u = 0; u < state_->unit_buckets.size(); ++u) {
    // A unit gathered, or on its way (a prefetch whose work may still write its memory, the peers being gone or not),
    // keeps its memory as it is: it is never freed under a running work.
    if (state_->unit_whole[u]) continue;
    for (const auto k : state_->unit_buckets[u]) {
      const auto& b = state_->buckets[k];
      allocate_memory(b.flat);
      b.flat.fill_(std::numeric_limits<double>::quiet_NaN());
      b.flat.narrow(0, me * b.layout.part, b.layout.part).copy_(b.share);
    }
    state_->unit_whole[u] = true;
  }
  return true;
}

void ShardedStep::feed(GradReducer& reducer, Optimizer& opt) {
  if (!reducer.layout_final()) return;
  if (&reducer != reducer_ || reducer.layout_version() != version_ || &opt != opt_ || !opt.sharded()) {
    adopt(reducer, opt);
    reducer_ = &reducer;
    version_ = reducer.layout_version();
    opt_ = &opt;
  }
  torch::NoGradGuard no_grad;
  const auto me = static_cast<std::size_t>(group_.rank());
  const bool from_shares = reducer.last_stats().scattered;
  for (std::size_t k = 0; k < state_->buckets.size(); ++k) {
    const auto& b = state_->buckets[k];
    if (!b.reduced) continue;  // a unit's frozen parameters: no gradient
    for (std::size_t j = 0; j < b.params.size(); ++j) {
      if (!b.in_opt[j]) continue;
      const auto [g, i] = b.opt_index[j];
      auto& piece = opt.shard_piece(g, i);
      const auto& range = opt.shard_plan().ranges[g][i];
      if (from_shares) {
        piece.mutable_grad() = at::empty({0}, piece.options());  // another rank's part: counted, not updated
      } else {
        const auto& grad = b.params[j].grad();
        if (!grad.defined()) continue;
        const auto in_order = grad.strides() == b.params[j].strides() && grad.is_non_overlapping_and_dense()
                                  ? grad
                                  : at::empty_like(b.params[j], at::MemoryFormat::Preserve).copy_(grad);
        piece.mutable_grad() = memory_order(in_order).narrow(0, range.begin, range.numel);
      }
    }
    if (!from_shares) continue;
    const auto& share = reducer.shares().at(k);
    for (const auto& piece : b.layout.pieces[me]) {
      if (!b.in_opt[piece.param]) continue;
      const auto [g, i] = b.opt_index[piece.param];
      opt.shard_piece(g, i).mutable_grad() = share.narrow(0, piece.part_offset, piece.numel);
    }
  }
}

void ShardedStep::gather_bucket(const Bucket& b, Group& group) {
  // This rank's part of the buffer holds its updated elements: it is what this rank sends, and where it receives.
  const auto part = static_cast<std::int64_t>(group.rank()) * b.layout.part;
  all_gather_into(b.flat, b.flat.narrow(0, part, b.layout.part), &group);
}

void ShardedStep::gather_params(State& state, Group& group) {
  torch::NoGradGuard no_grad;
  for (const auto& b : state.buckets) {
    if (b.unit < 0) {
      gather_bucket(b, group);
      continue;
    }
    // The step changed the share, not these tensors: what reads them (autograd's checks, caches) must see a new
    // version, as after an update in place.
    for (const auto& p : b.params) torch::autograd::impl::bump_version(p);
  }
  for (std::size_t u = 0; u < state.unit_buckets.size(); ++u) {
    if (!state.unit_whole[u]) continue;
    for (auto& [work, call] : state.in_flight[u]) work->wait();  // a prefetch the step overtook (not expected)
    state.in_flight[u].clear();
    for (const auto k : state.unit_buckets[u]) release_memory(state.buckets[k].flat);
    state.unit_whole[u] = false;
  }
}

std::vector<at::Tensor> ShardedStep::gradients(Optimizer& opt) const {
  std::vector<at::Tensor> out;
  if (!opt.sharded()) return out;
  for (std::size_t g = 0; g < opt.param_groups().size(); ++g)
    for (std::size_t i = 0; i < opt.param_groups()[g].params.size(); ++i) {
      const auto& grad = opt.shard_piece(g, i).grad();
      if (grad.defined() && grad.numel() > 0) out.push_back(grad);
    }
  return out;
}

}  // namespace fastlearn
