#include <fastlearn/optim/sgd.h>

#include <fastlearn/core/error.h>

#include <fmt/format.h>
#include <torch/torch.h>

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

void SGDOptimizer::step_group(ParamGroup& group, GroupState& state, const std::vector<std::size_t>& active) {
  check_grads(group, active, "SGD");
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
