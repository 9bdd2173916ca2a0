#include <fastlearn/optim/adam.h>

#include <fastlearn/core/error.h>

#include <fmt/format.h>
#include <torch/torch.h>

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

void AdamOptimizer::step_group(ParamGroup& group, GroupState& state, const std::vector<std::size_t>& active) {
  check_grads(group, active, "Adam");
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
