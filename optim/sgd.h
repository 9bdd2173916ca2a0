#pragma once
// SGD with momentum and nesterov, as torch.optim.SGD, with decoupled or L2 weight decay. On CPU the update of a
// dense parameter is one fused, vectorized pass (ATen's _fused_sgd_); anything else uses at::_foreach_* ops.
#include <fastlearn/optim/optimizer.h>

namespace fastlearn {

struct SGDOptions {
  double mom = 0.0;
  double wd = 0.0;
  bool nesterov = false;
  bool decouple_wd = true;  ///< true: p *= 1 - lr*wd before the update; false: L2, grad += wd*p
  bool fused = true;        ///< fused CPU kernels where the tensors allow; false: at::_foreach_* ops only
};

/// SGD with optional momentum (no dampening; the buffer starts as the first gradient) and nesterov, as
/// torch.optim.SGD. With mom == 0 at construction there is no momentum buffer and "mom" is ignored later.
/// Hypers: lr, mom, wd.
class SGDOptimizer : public Optimizer {
 public:
  SGDOptimizer(std::vector<std::vector<at::Tensor>> param_groups, double lr, SGDOptions options = {});
  std::string type() const override { return "SGD"; }
  const SGDOptions& options() const { return options_; }

 protected:
  void step_group(ParamGroup& group, GroupState& state, const std::vector<std::size_t>& active) override;
  std::vector<std::string> state_names() const override;

 private:
  void step_group_on_device(ParamGroup& group, GroupState& state, const std::vector<std::size_t>& active);
  SGDOptions options_;
  bool has_momentum_;
};

/// SGD, fastai's defaults (no momentum, no weight decay).
OptFunc SGD(SGDOptions options = {});

}  // namespace fastlearn
