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
  last_norm_ = torch::nn::utils::clip_grad_norm_(learn().model().parameters(), options_.max_norm, options_.norm_type);
}

}  // namespace fastlearn
