#include <fastlearn/distributed/detail/sharded_step.h>

#include <fastlearn/comm/collectives.h>
#include <fastlearn/core/detail/memory_order.h>
#include <fastlearn/core/error.h>
#include <fastlearn/distributed/grad_reducer.h>
#include <fastlearn/optim/optimizer.h>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/torch.h>

#include <unordered_map>

namespace fastlearn {

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
    const auto offset = b.layout.param_offsets[j];
    b.flat.narrow(0, offset, p.numel()).copy_(memory_order(p.detach()));
    p.set_(b.flat.storage(), b.flat.storage_offset() + offset, p.sizes(), p.strides());
  }
}

void ShardedStep::adopt(const GradReducer& reducer, Optimizer& opt) {
  std::unordered_map<const c10::TensorImpl*, std::pair<std::size_t, std::size_t>> where;
  ShardPlan plan;
  for (std::size_t g = 0; g < opt.param_groups().size(); ++g) {
    const auto& params = opt.param_groups()[g].params;
    plan.ranges.emplace_back(params.size());
    for (std::size_t i = 0; i < params.size(); ++i) where.emplace(params[i].unsafeGetTensorImpl(), std::pair{g, i});
  }
  const auto me = static_cast<std::size_t>(group_.rank());
  std::vector<Bucket> buckets;
  for (auto& params : reducer.bucket_params()) {
    auto& b = buckets.emplace_back();
    std::vector<std::int64_t> numels;
    for (const auto& p : params) numels.push_back(p.numel());
    b.layout = shard_bucket(numels, group_.size());
    b.params = std::move(params);
    flatten(b);
    for (const auto& p : b.params) {
      const auto it = where.find(p.unsafeGetTensorImpl());
      b.in_opt.push_back(it != where.end());
      b.opt_index.push_back(it != where.end() ? it->second : std::pair<std::size_t, std::size_t>{0, 0});
    }
    for (const auto& piece : b.layout.pieces[me]) {
      if (!b.in_opt[piece.param]) continue;
      const auto [g, i] = b.opt_index[piece.param];
      plan.ranges[g][i] = {.begin = piece.param_offset, .numel = piece.numel};
    }
  }
  // The optimizer keeps the plan after this object (a fit's) is gone: the gather holds the group, which outlives it.
  plan.gather = [group = &group_](const at::Tensor& whole, const at::Tensor& piece, const ShardRange& range) {
    auto flat = memory_order(whole);
    if (range.numel > 0) flat.narrow(0, range.begin, range.numel).copy_(piece);
    all_reduce(flat, ReduceOp::sum, group);  // the others' elements are zeros here
  };
  auto shared = std::make_shared<const std::vector<Bucket>>(std::move(buckets));
  plan.gather_params = [shared, group = &group_] { gather_params(*shared, *group); };
  opt.shard(std::move(plan));
  buckets_ = std::move(shared);
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
  for (std::size_t k = 0; k < buckets_->size(); ++k) {
    const auto& b = (*buckets_)[k];
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

void ShardedStep::gather_params(const std::vector<Bucket>& buckets, Group& group) {
  torch::NoGradGuard no_grad;
  const auto me = static_cast<std::size_t>(group.rank());
  for (const auto& b : buckets) {
    // This rank's part of the buffer holds its updated elements: it is what this rank sends, and where it receives.
    const auto part = static_cast<std::int64_t>(me) * b.layout.part;
    all_gather_into(b.flat, b.flat.narrow(0, part, b.layout.part), &group);
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
