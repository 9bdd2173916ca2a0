#pragma once
// Adam and AdamW, as torch.optim.Adam(W), with fastai's defaults. The update of a dense parameter is one fused
// pass (ATen's _fused_adam_ / _fused_adamw_: vectorized on the CPU, one kernel per device and dtype on a GPU);
// anything else uses at::_foreach_* ops.
#include <fastlearn/optim/optimizer.h>

namespace fastlearn {

struct AdamOptions {
  double mom = 0.9;       ///< beta1
  double sqr_mom = 0.99;  ///< beta2
  double eps = 1e-5;
  double wd = 0.01;
  bool decouple_wd = true;  ///< true: p *= 1 - lr*wd before the update (AdamW); false: L2, grad += wd*p
  bool fused = true;        ///< fused kernels (CPU and CUDA) where the tensors allow; false: at::_foreach_* ops only
};

/// Adam with bias correction as torch.optim.Adam (denominator sqrt(v)/sqrt(1 - sqr_mom^t) + eps).
/// Hypers: lr, mom, sqr_mom, eps, wd. State: "exp_avg", "exp_avg_sq".
class AdamOptimizer : public Optimizer {
 public:
  AdamOptimizer(std::vector<std::vector<at::Tensor>> param_groups, double lr, AdamOptions options = {});
  std::string type() const override { return "Adam"; }
  const AdamOptions& options() const { return options_; }

 protected:
  void step_group(ParamGroup& group, GroupState& state, const std::vector<std::size_t>& active) override;
  std::vector<std::string> state_names() const override;

 private:
  void step_group_on_device(ParamGroup& group, GroupState& state, const std::vector<std::size_t>& active);
  AdamOptions options_;
};

/// Adam with fastai's defaults (mom 0.9, sqr_mom 0.99, eps 1e-5, decoupled wd 0.01).
OptFunc Adam(AdamOptions options = {});
/// Adam with decoupled weight decay and torch.optim.AdamW's defaults (0.9, 0.999, 1e-8, wd 0.01). Those
/// defaults apply only when no options are passed: AdamW({.wd = 0.1}) starts from AdamOptions' (fastai's)
/// defaults, so spell out sqr_mom and eps when passing options.
OptFunc AdamW(AdamOptions options = {.mom = 0.9, .sqr_mom = 0.999, .eps = 1e-8, .wd = 0.01, .decouple_wd = true});

}  // namespace fastlearn
