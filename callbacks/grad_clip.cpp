#include <fastlearn/callbacks/grad_clip.h>

#include <fastlearn/core/error.h>
#include <fastlearn/learner/callback_order.h>
#include <fastlearn/learner/learner.h>

#include <torch/torch.h>

#include <cmath>

namespace fastlearn {

GradientClip::GradientClip(GradientClipOptions options) : options_(options) {
  if (options_.max_norm <= 0) throw ConfigError("GradientClip: max_norm must be > 0");
  order = cb_order::grad_clip;
  run_valid = false;
}

void GradientClip::before_step() {
  // Sharded gradients: this process's shares; the norm is then summed over the processes, so that every process
  // clips by the norm of the whole gradient.
  auto [grads, shares] = learn().step_gradients();
  if (grads.empty() && !shares) return;
  torch::NoGradGuard no_grad;
  // The global norm is the norm of the per-tensor norms (any p); all on the gradients' device, no host read.
  const double p = options_.norm_type;
  at::Tensor norm;
  if (!shares) {
    std::vector<at::Tensor> norms;
    for (const auto& n : at::_foreach_norm(grads, p)) norms.push_back(n.to(at::kFloat));
    norm = at::linalg_vector_norm(at::stack(norms), p);
  } else {
    // Over the processes: the maximum for the infinity norm, else the p-th root of the sum of p-th powers.
    const bool max = std::isinf(p);
    const auto device =
        learn().model().parameters().empty() ? at::Device(at::kCPU) : learn().model().parameters().front().device();
    auto mine = at::zeros({1}, at::TensorOptions().dtype(at::kFloat).device(device));
    if (!grads.empty()) {
      std::vector<at::Tensor> norms;
      for (const auto& n : at::_foreach_norm(grads, p)) norms.push_back(n.to(at::kFloat));
      const auto local = at::linalg_vector_norm(at::stack(norms), p);
      mine.copy_(max ? local.reshape({1}) : local.pow(p).reshape({1}));
    }
    learn().coordination().reduce_over_processes(mine, max);
    norm = max ? mine.squeeze(0) : mine.squeeze(0).pow(1.0 / p);
  }
  if (!last_norm_.defined() || last_norm_.device() != norm.device()) last_norm_ = at::empty_like(norm);
  last_norm_.copy_(norm);
  const auto coef = (options_.max_norm / (norm + 1e-6)).clamp_max(1.0);
  at::_foreach_mul_(grads, coef);
}

double GradientClip::last_norm() const { return last_norm_.defined() ? last_norm_.item<double>() : 0.0; }

}  // namespace fastlearn
