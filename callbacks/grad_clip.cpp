#include <fastlearn/callbacks/grad_clip.h>

#include <fastlearn/core/error.h>
#include <fastlearn/learner/callback_order.h>
#include <fastlearn/learner/learner.h>

#include <torch/torch.h>

namespace fastlearn {

GradientClip::GradientClip(GradientClipOptions options) : options_(options) {
  if (options_.max_norm <= 0) throw ConfigError("GradientClip: max_norm must be > 0");
  order = cb_order::grad_clip;
  run_valid = false;
}

void GradientClip::before_step() {
  std::vector<at::Tensor> grads;  // the optimizer's parameters: each once, also when layers share a weight
  for (auto& group : learn().opt().param_groups()) {
    for (auto& p : group.params) {
      if (p.grad().defined()) grads.push_back(p.mutable_grad());
    }
  }
  if (grads.empty()) return;
  torch::NoGradGuard no_grad;
  // The global norm is the norm of the per-tensor norms (any p); all on the gradients' device, no host read.
  std::vector<at::Tensor> norms;
  for (const auto& n : at::_foreach_norm(grads, options_.norm_type)) norms.push_back(n.to(at::kFloat));
  const auto norm = at::linalg_vector_norm(at::stack(norms), options_.norm_type);
  if (!last_norm_.defined() || last_norm_.device() != norm.device()) last_norm_ = at::empty_like(norm);
  last_norm_.copy_(norm);
  const auto coef = (options_.max_norm / (norm + 1e-6)).clamp_max(1.0);
  at::_foreach_mul_(grads, coef);
}

double GradientClip::last_norm() const { return last_norm_.defined() ? last_norm_.item<double>() : 0.0; }

}  // namespace fastlearn
