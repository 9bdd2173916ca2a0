#include <fastlearn/callbacks/mixed_precision.h>

#include <fastlearn/core/error.h>
#include <fastlearn/learner/callback_order.h>
#include <fastlearn/learner/learner.h>

#include <ATen/autocast_mode.h>
#include <torch/torch.h>

namespace fastlearn {

MixedPrecision::MixedPrecision(MixedPrecisionOptions options) : options_(options) { order = cb_order::mixed_precision; }

MixedPrecision::~MixedPrecision() {
  if (in_autocast_) exit_autocast();
}

void MixedPrecision::before_fit() {
  auto params = learn().model().parameters();
  device_type_ = params.empty() ? c10::DeviceType::CPU : params.front().device().type();
  if (device_type_ != c10::DeviceType::CPU && device_type_ != c10::DeviceType::CUDA) {
    throw ConfigError("MixedPrecision: autocast supports models on CPU or CUDA only");
  }
  dtype_ = options_.dtype.value_or(device_type_ == c10::DeviceType::CUDA ? at::kHalf : at::kBFloat16);
  if (dtype_ != at::kHalf && dtype_ != at::kBFloat16) {
    throw ConfigError("MixedPrecision: dtype must be Half (float16) or BFloat16");
  }
  scaling_ = options_.loss_scaling.value_or(dtype_ == at::kHalf);
  const auto device = params.empty() ? at::Device(at::kCPU) : params.front().device();
  // Created once per fit; a resumed fit starts from the initial scale again, as GradScaler does.
  scale_ = at::full({1}, options_.init_scale, at::TensorOptions().dtype(at::kFloat).device(device));
  growth_tracker_ = at::zeros({1}, at::TensorOptions().dtype(at::kInt).device(device));
  found_inf_ = at::zeros({1}, at::TensorOptions().dtype(at::kFloat).device(device));
  skipped_ = 0;
}

void MixedPrecision::enter_autocast() {
  exit_autocast();  // a region left open by an exception between before_batch and after_loss
  previous_enabled_ = at::autocast::is_autocast_enabled(device_type_);
  previous_dtype_ = at::autocast::get_autocast_dtype(device_type_);
  at::autocast::set_autocast_enabled(device_type_, true);
  at::autocast::set_autocast_dtype(device_type_, dtype_);
  at::autocast::increment_nesting();
  in_autocast_ = true;
}

void MixedPrecision::exit_autocast() {
  if (!in_autocast_) return;
  // Casted weights are cached for the duration of one autocast region; drop them at its end.
  if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
  at::autocast::set_autocast_enabled(device_type_, previous_enabled_);
  at::autocast::set_autocast_dtype(device_type_, previous_dtype_);
  in_autocast_ = false;
}

void MixedPrecision::before_batch() { enter_autocast(); }
void MixedPrecision::after_loss() { exit_autocast(); }
// Any cancel can leave the batch between before_batch and after_loss: close the region at every exit.
void MixedPrecision::after_cancel_batch() { exit_autocast(); }
// A replayed step (LearnerOptions::cuda_graph) fires no after_loss.
void MixedPrecision::after_batch() { exit_autocast(); }

CaptureSupport MixedPrecision::step_capture() const {
  if (!scaling_) return {.kind = StepCapture::capturable, .why = {}};
  return {.kind = StepCapture::eager_only,
          .why =
              "float16 loss scaling reads back whether a gradient overflowed to skip that step; bfloat16 "
              "(MixedPrecisionOptions::dtype = at::kBFloat16) needs no scaling and is captured"};
}
void MixedPrecision::after_train() { exit_autocast(); }
void MixedPrecision::after_validate() { exit_autocast(); }
void MixedPrecision::after_epoch() { exit_autocast(); }
void MixedPrecision::after_fit() { exit_autocast(); }

void MixedPrecision::after_pred() {
  // Metrics, the Recorder and get_preds see full-precision predictions (as fastai's to_float).
  const auto to_float = [](at::Tensor& t) {
    if (t.defined() && (t.scalar_type() == at::kHalf || t.scalar_type() == at::kBFloat16)) t = t.to(at::kFloat);
  };
  to_float(learn().pred);
  for (auto& extra : learn().extra_preds) to_float(extra);
}

void MixedPrecision::before_backward() {
  unscaled_ = false;
  if (!scaling_) return;
  auto& l = learn();
  l.loss_grad = l.loss_grad * scale_;  // float32: a half loss is promoted, so the scale cannot overflow it
}

void MixedPrecision::before_step() {
  if (!scaling_) return;
  // Sharded gradients: this process's shares, and an overflow in any process's skips the step on every process.
  auto [grads, shares] = learn().step_gradients();
  found_inf_.zero_();
  if (!grads.empty()) at::_amp_foreach_non_finite_check_and_unscale_(grads, found_inf_, scale_.reciprocal());
  if (shares) learn().coordination().reduce_over_processes(found_inf_, /*max=*/true);
  unscaled_ = true;
  if (found_inf_.item<float>() > 0) {
    ++skipped_;
    throw CancelStepException();
  }
}

void MixedPrecision::after_step() {
  if (!scaling_ || !unscaled_) return;
  at::_amp_update_scale_(scale_, growth_tracker_, found_inf_, options_.growth_factor, options_.backoff_factor,
                         options_.growth_interval);
  unscaled_ = false;
}

double MixedPrecision::scale() const { return scaling_ && scale_.defined() ? scale_.item<double>() : 1.0; }

}  // namespace fastlearn
