#pragma once
// GradientClip: keeps one bad batch from wrecking training by bounding the gradients' global norm.
#include <fastlearn/learner/callback.h>

#include <ATen/core/Tensor.h>

namespace fastlearn {

struct GradientClipOptions {
  double max_norm = 1.0;
  double norm_type = 2.0;
};

/// Clips the global norm of all gradients to max_norm before each optimizer step (after unscaling by
/// MixedPrecision).
class GradientClip : public Callback {
 public:
  explicit GradientClip(GradientClipOptions options = {});
  std::string name() const override { return "gradient_clip"; }
  void before_step() override;
  /// Capturable: the norm and the scaling are computed on the gradients' device, with nothing read back.
  CaptureSupport step_capture() const override { return {.kind = StepCapture::capturable, .why = {}}; }
  /// The total norm before clipping at the last step (read from the device when asked: a GPU is not made
  /// to wait for the host at every step, unlike LibTorch's clip_grad_norm_, which returns a double).
  double last_norm() const;

 private:
  GradientClipOptions options_;
  at::Tensor last_norm_;  ///< one buffer, written in place: a replayed step (cuda_graph) updates the one it captured
};

}  // namespace fastlearn
