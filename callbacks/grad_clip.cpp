#include <fastlearn/callbacks/grad_clip.h>

#include <fastlearn/core/error.h>
#include <fastlearn/learner/learner.h>

#include <torch/nn/utils/clip_grad.h>

namespace fastlearn {

GradientClip::GradientClip(GradientClipOptions options) : options_(options) {
  if (options_.max_norm <= 0) throw ConfigError("GradientClip: max_norm must be > 0");
  order = 11;  // after MixedPrecision's unscaling
  run_valid = false;
}

void GradientClip::before_step() {
  std::vector<at::Tensor> params;  // the optimizer's: each parameter once, also when layers share a weight
  for (auto& group : learn().opt().param_groups()) params.insert(params.end(), group.params.begin(), group.params.end());
  last_norm_ = torch::nn::utils::clip_grad_norm_(params, options_.max_norm, options_.norm_type);
}

}  // namespace fastlearn
