#include <fastlearn/optim/adam.h>

#include <fastlearn/core/error.h>

#include <fmt/format.h>
#include <torch/torch.h>

#include <algorithm>
#include <initializer_list>

namespace fastlearn {

namespace {

void validate(const AdamOptions& o) {
  for (const auto& [name, v] : std::initializer_list<std::pair<const char*, double>>{
           {"mom", o.mom}, {"sqr_mom", o.sqr_mom}, {"eps", o.eps}, {"wd", o.wd}})
    Optimizer::check_finite(name, v, "Adam");
  if (o.mom < 0 || o.mom >= 1) throw ConfigError(fmt::format("Adam: mom (beta1) must be in [0, 1), got {}", o.mom));
  if (o.sqr_mom < 0 || o.sqr_mom >= 1)
    throw ConfigError(fmt::format("Adam: sqr_mom (beta2) must be in [0, 1), got {}", o.sqr_mom));
  if (o.eps < 0) throw ConfigError(fmt::format("Adam: eps must be >= 0, got {}", o.eps));
  if (o.wd < 0) throw ConfigError(fmt::format("Adam: wd must be >= 0, got {}", o.wd));
}

}  // namespace

AdamOptimizer::AdamOptimizer(std::vector<std::vector<at::Tensor>> param_groups, double lr, AdamOptions options)
    : Optimizer((validate(options), validate_lr(lr, "Adam"),
                 make_groups(std::move(param_groups), {{"lr", lr},
                                                       {"mom", options.mom},
                                                       {"sqr_mom", options.sqr_mom},
                                                       {"eps", options.eps},
                                                       {"wd", options.wd}}))),
      options_(options) {}

std::vector<std::string> AdamOptimizer::state_names() const { return {"exp_avg", "exp_avg_sq"}; }

// The update with every hyper-parameter and step count read from the device (device_hypers): the same formula as
// below, each factor a 0-dim tensor, and no branch on a value that changes between steps.
void AdamOptimizer::step_group_on_device(ParamGroup& group, GroupState& state, const std::vector<std::size_t>& active) {
  const auto& lr = hyper_on_device(state, "lr", "Adam");
  const auto& beta1 = hyper_on_device(state, "mom", "Adam");
  const auto& beta2 = hyper_on_device(state, "sqr_mom", "Adam");
  const auto& eps = hyper_on_device(state, "eps", "Adam");
  const auto& wd = hyper_on_device(state, "wd", "Adam");
  auto& exp_avg = state.tensors["exp_avg"];
  auto& exp_avg_sq = state.tensors["exp_avg_sq"];
  exp_avg.resize(group.params.size());
  exp_avg_sq.resize(group.params.size());
  // Bias corrections in float64 from each parameter's count: step size lr / (1 - beta1^t), sqrt(1 - beta2^t).
  const auto t = state.steps_on_device.to(at::kDouble);
  const auto step_size = lr / (1 - at::pow(beta1, t));
  const auto bc2_sqrt = at::sqrt(1 - at::pow(beta2, t));
  const auto keep = 1 - lr * wd;
  // One list per dtype (a group's parameters are on one device).
  struct Lists {
    at::ScalarType dtype;
    std::vector<at::Tensor> p, g, m, v, step_size, bc2_sqrt;
  };
  std::vector<Lists> lists;
  for (const auto i : active) {
    const auto& p = group.params[i];
    if (state.steps[i] == 1) {
      exp_avg[i] = at::zeros_like(p, at::MemoryFormat::Preserve);
      exp_avg_sq[i] = at::zeros_like(p, at::MemoryFormat::Preserve);
    }
    auto it = std::find_if(lists.begin(), lists.end(), [&](const Lists& l) { return l.dtype == p.scalar_type(); });
    auto& l = it != lists.end() ? *it : lists.emplace_back(Lists{.dtype = p.scalar_type()});
    l.p.push_back(p);
    l.g.push_back(p.grad());
    l.m.push_back(exp_avg[i]);
    l.v.push_back(exp_avg_sq[i]);
    const auto at_i = static_cast<std::int64_t>(i);
    l.step_size.push_back(step_size.select(0, at_i).to(p.scalar_type()));
    l.bc2_sqrt.push_back(bc2_sqrt.select(0, at_i).to(p.scalar_type()));
  }
  for (auto& l : lists) {
    const auto as = [&](const at::Tensor& x) { return x.to(l.dtype); };
    auto grads = l.g;
    if (options_.decouple_wd)
      at::_foreach_mul_(l.p, as(keep));
    else
      grads = at::_foreach_add(l.g, at::_foreach_mul(l.p, as(wd)));  // a new list: the gradients stay untouched
    at::_foreach_mul_(l.m, as(beta1));
    at::_foreach_add_(l.m, at::_foreach_mul(grads, as(1 - beta1)));
    at::_foreach_mul_(l.v, as(beta2));
    at::_foreach_add_(l.v, at::_foreach_mul(at::_foreach_mul(grads, grads), as(1 - beta2)));
    auto denom = at::_foreach_sqrt(l.v);
    at::_foreach_div_(denom, l.bc2_sqrt);
    at::_foreach_add_(denom, as(eps));
    auto update = at::_foreach_div(l.m, denom);
    at::_foreach_mul_(update, l.step_size);
    at::_foreach_add_(l.p, update, -1);
  }
}

void AdamOptimizer::step_group(ParamGroup& group, GroupState& state, const std::vector<std::size_t>& active) {
  check_grads(group, active, "Adam");
  if (reads_device_hypers()) return step_group_on_device(group, state, active);
  const double lr = read_hyper(group, "lr", "Adam");
  const double beta1 = read_hyper(group, "mom", "Adam");
  const double beta2 = read_hyper(group, "sqr_mom", "Adam");
  const double eps = read_hyper(group, "eps", "Adam");
  const double wd = read_hyper(group, "wd", "Adam");
  auto& exp_avg = state.tensors["exp_avg"];
  auto& exp_avg_sq = state.tensors["exp_avg_sq"];
  exp_avg.resize(group.params.size());
  exp_avg_sq.resize(group.params.size());

  // Fused lists: one for the CPU (its kernel takes any mix of dtypes), one per device and dtype on a GPU.
  struct Fused {
    c10::Device device;
    at::ScalarType dtype;
    std::vector<at::Tensor> p, g, m, v, steps;
  };
  std::vector<Fused> fused;
  auto fused_for = [&](const at::Tensor& p) -> Fused& {
    for (auto& f : fused)
      if (f.device == p.device() && (p.is_cpu() || f.dtype == p.scalar_type())) return f;
    return fused.emplace_back(Fused{.device = p.device(), .dtype = p.scalar_type()});
  };
  std::vector<at::Tensor> gp, gg, gm, gv;  // general lists
  std::vector<at::Scalar> neg_step_size, bc2_sqrt;
  for (const auto i : active) {
    const auto& p = group.params[i];
    const auto& g = p.grad();
    if (state.steps[i] == 1) {
      exp_avg[i] = at::zeros_like(p, at::MemoryFormat::Preserve);
      exp_avg_sq[i] = at::zeros_like(p, at::MemoryFormat::Preserve);
    }
    if (options_.fused && fusable(p, g, /*cuda_too=*/true) && same_layout(exp_avg[i], p) &&
        same_layout(exp_avg_sq[i], p)) {
      auto& f = fused_for(p);
      f.p.push_back(fused_operand(p));
      f.g.push_back(fused_operand(g));
      f.m.push_back(fused_operand(exp_avg[i]));
      f.v.push_back(fused_operand(exp_avg_sq[i]));
      f.steps.push_back(step_views_on(state, p.device())[i]);
    } else {
      gp.push_back(p);
      gg.push_back(g);
      gm.push_back(exp_avg[i]);
      gv.push_back(exp_avg_sq[i]);
      // Bias corrections in double from the exact step count, as torch::optim::Adam computes them.
      const auto t = static_cast<double>(state.steps[i]);
      neg_step_size.emplace_back(-lr / (1 - std::pow(beta1, t)));
      bc2_sqrt.emplace_back(std::sqrt(1 - std::pow(beta2, t)));
    }
  }
  for (auto& f : fused) {
    if (options_.decouple_wd)
      at::_fused_adamw_(f.p, f.g, f.m, f.v, {}, f.steps, lr, beta1, beta2, wd, eps, /*amsgrad=*/false,
                        /*maximize=*/false);
    else
      at::_fused_adam_(f.p, f.g, f.m, f.v, {}, f.steps, lr, beta1, beta2, wd, eps, /*amsgrad=*/false,
                       /*maximize=*/false);
  }
  if (gp.empty()) return;
  if (wd != 0) {
    if (options_.decouple_wd)
      at::_foreach_mul_(gp, 1 - lr * wd);
    else
      gg = at::_foreach_add(gg, gp, wd);  // a new list: the gradients themselves stay untouched
  }
  at::_foreach_mul_(gm, beta1);
  at::_foreach_add_(gm, gg, 1 - beta1);
  at::_foreach_mul_(gv, beta2);
  at::_foreach_addcmul_(gv, gg, gg, 1 - beta2);
  auto denom = at::_foreach_sqrt(gv);
  at::_foreach_div_(denom, bc2_sqrt);
  at::_foreach_add_(denom, eps);
  at::_foreach_addcdiv_(gp, gm, denom, neg_step_size);
}

OptFunc Adam(AdamOptions options) {
  validate(options);
  return [options](std::vector<std::vector<at::Tensor>> param_groups, double lr) -> std::unique_ptr<Optimizer> {
    return std::make_unique<AdamOptimizer>(std::move(param_groups), lr, options);
  };
}

OptFunc AdamW(AdamOptions options) { return Adam(options); }

}  // namespace fastlearn
