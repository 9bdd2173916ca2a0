#include <fastlearn/optim/sgd.h>

#include <fastlearn/core/error.h>

#include <fmt/format.h>
#include <torch/torch.h>

#include <algorithm>
#include <initializer_list>

namespace fastlearn {

namespace {

void validate(const SGDOptions& o) {
  Optimizer::check_finite("mom", o.mom, "SGD");
  Optimizer::check_finite("wd", o.wd, "SGD");
  if (o.mom < 0) throw ConfigError(fmt::format("SGD: mom must be >= 0, got {}", o.mom));
  if (o.wd < 0) throw ConfigError(fmt::format("SGD: wd must be >= 0, got {}", o.wd));
  if (o.nesterov && o.mom <= 0)
    throw ConfigError("SGD: nesterov needs momentum; set mom > 0 (e.g. {.mom = 0.9, .nesterov = true})");
}

}  // namespace

SGDOptimizer::SGDOptimizer(std::vector<std::vector<at::Tensor>> param_groups, double lr, SGDOptions options)
    : Optimizer((validate(options), validate_lr(lr, "SGD"),
                 make_groups(std::move(param_groups), {{"lr", lr}, {"mom", options.mom}, {"wd", options.wd}}))),
      options_(options),
      has_momentum_(options.mom != 0) {}

std::vector<std::string> SGDOptimizer::state_names() const {
  return has_momentum_ ? std::vector<std::string>{"momentum_buffer"} : std::vector<std::string>{};
}

// The update with every hyper-parameter read from the device (device_hypers): the same formula as below, each factor
// a 0-dim tensor, and no branch on a value that changes between steps.
void SGDOptimizer::step_group_on_device(ParamGroup& group, GroupState& state, const std::vector<std::size_t>& active) {
  const auto& lr = hyper_on_device(state, "lr", "SGD");
  const auto& wd = hyper_on_device(state, "wd", "SGD");
  auto* bufs = has_momentum_ ? &state.tensors["momentum_buffer"] : nullptr;
  if (bufs) bufs->resize(group.params.size());
  const auto keep = 1 - lr * wd;
  struct Lists {
    at::ScalarType dtype;
    std::vector<at::Tensor> p, g, first_p, first_g, bufs;  // first_*: first updates (the buffer starts as the gradient)
    std::vector<std::size_t> first;
  };
  std::vector<Lists> lists;
  for (const auto i : active) {
    const auto& p = group.params[i];
    auto it = std::find_if(lists.begin(), lists.end(), [&](const Lists& l) { return l.dtype == p.scalar_type(); });
    auto& l = it != lists.end() ? *it : lists.emplace_back(Lists{.dtype = p.scalar_type()});
    l.p.push_back(p);
    l.g.push_back(p.grad());
    if (bufs) {
      if (state.steps[i] == 1) (*bufs)[i] = at::empty_like(p, at::MemoryFormat::Preserve);
      l.bufs.push_back((*bufs)[i]);
      if (state.steps[i] == 1) l.first.push_back(l.bufs.size() - 1);
    }
  }
  for (auto& l : lists) {
    const auto as = [&](const at::Tensor& x) { return x.to(l.dtype); };
    auto d = l.g;
    if (options_.decouple_wd)
      at::_foreach_mul_(l.p, as(keep));
    else
      d = at::_foreach_add(l.g, at::_foreach_mul(l.p, as(wd)));  // a new list: the gradients stay untouched
    if (bufs) {
      const auto mom = as(hyper_on_device(state, "mom", "SGD"));
      at::_foreach_mul_(l.bufs, mom);  // a first update's buffer is then overwritten with the gradient
      for (const auto k : l.first) l.bufs[k].copy_(d[k]);
      std::vector<at::Tensor> old_bufs, old_d;
      for (std::size_t k = 0; k < l.bufs.size(); ++k)
        if (std::find(l.first.begin(), l.first.end(), k) == l.first.end()) {
          old_bufs.push_back(l.bufs[k]);
          old_d.push_back(d[k]);
        }
      if (!old_bufs.empty()) at::_foreach_add_(old_bufs, old_d);
      d = options_.nesterov ? at::_foreach_add(d, at::_foreach_mul(l.bufs, mom)) : l.bufs;
    }
    at::_foreach_add_(l.p, at::_foreach_mul(d, as(lr)), -1);
  }
}

void SGDOptimizer::step_group(ParamGroup& group, GroupState& state, const std::vector<std::size_t>& active) {
  check_grads(group, active, "SGD");
  if (reads_device_hypers()) return step_group_on_device(group, state, active);
  const double lr = read_hyper(group, "lr", "SGD");
  const double wd = read_hyper(group, "wd", "SGD");
  const double mom = has_momentum_ ? read_hyper(group, "mom", "SGD") : 0.0;
  const bool decoupled = options_.decouple_wd && wd != 0;
  const double l2 = options_.decouple_wd ? 0.0 : wd;
  auto* bufs = has_momentum_ ? &state.tensors["momentum_buffer"] : nullptr;
  if (bufs) bufs->resize(group.params.size());

  std::vector<at::Tensor> params, grads;
  for (const auto i : active) {
    params.push_back(group.params[i]);
    grads.push_back(group.params[i].grad());
  }
  if (decoupled) at::_foreach_mul_(params, 1 - lr * wd);

  // The fused kernel skips the buffer when momentum is 0; a buffer that exists must still decay, so then
  // the group takes the general path.
  const bool fuse_group = options_.fused && !(has_momentum_ && mom == 0);
  std::vector<at::Tensor> fp[2], fg[2], fb[2];  // fused lists; [1]: first update (the buffer starts as the gradient)
  std::vector<std::size_t> general;
  for (std::size_t k = 0; k < active.size(); ++k) {
    const auto i = active[k];
    const bool first = state.steps[i] == 1;
    if (fuse_group && fusable(params[k], grads[k]) && (!bufs || first || same_layout((*bufs)[i], params[k]))) {
      fp[first].push_back(fused_operand(params[k]));
      fg[first].push_back(fused_operand(grads[k]));
      if (bufs) {
        if (first) (*bufs)[i] = at::empty_like(params[k], at::MemoryFormat::Preserve);
        fb[first].push_back(fused_operand((*bufs)[i]));
      }
    } else {
      general.push_back(k);
    }
  }
  for (int first = 0; first < 2; ++first)
    if (!fp[first].empty())
      at::_fused_sgd_(fp[first], fg[first], fb[first], l2, mom, lr, /*dampening=*/0.0, options_.nesterov,
                      /*maximize=*/false, /*is_first_step=*/first == 1);
  if (general.empty()) return;

  std::vector<at::Tensor> gp, gd;
  for (const auto k : general) {
    gp.push_back(params[k]);
    gd.push_back(grads[k]);
  }
  if (l2 != 0) gd = at::_foreach_add(gd, gp, l2);  // a new list: the gradients themselves stay untouched
  if (bufs) {
    std::vector<at::Tensor> all_bufs, old_bufs, old_d;
    for (std::size_t n = 0; n < general.size(); ++n) {
      const auto i = active[general[n]];
      auto& buf = (*bufs)[i];
      if (state.steps[i] == 1) {
        buf = at::empty_like(gp[n], at::MemoryFormat::Preserve).copy_(gd[n]);
      } else {
        old_bufs.push_back(buf);
        old_d.push_back(gd[n]);
      }
      all_bufs.push_back(buf);
    }
    if (!old_bufs.empty()) {
      at::_foreach_mul_(old_bufs, mom);
      at::_foreach_add_(old_bufs, old_d);
    }
    if (options_.nesterov)
      gd = at::_foreach_add(gd, all_bufs, mom);
    else
      gd = std::move(all_bufs);
  }
  at::_foreach_add_(gp, gd, -lr);
}

OptFunc SGD(SGDOptions options) {
  validate(options);
  return [options](std::vector<std::vector<at::Tensor>> param_groups, double lr) -> std::unique_ptr<Optimizer> {
    return std::make_unique<SGDOptimizer>(std::move(param_groups), lr, options);
  };
}

}  // namespace fastlearn
