#pragma once
// MixedPrecision: runs the forward pass and the loss under autocast (bfloat16 on CPU, float16 on
// CUDA by default). With float16, the loss is scaled before backward so small gradients do not
// underflow; before the step the gradients are unscaled and checked, a step with an inf or NaN
// gradient is skipped (CancelStep) and the scale backs off; after growth_interval good steps it grows.
#include <fastlearn/learner/callback.h>

#include <ATen/core/Tensor.h>
#include <c10/core/DeviceType.h>
#include <c10/core/ScalarType.h>

#include <optional>

namespace fastlearn {

struct MixedPrecisionOptions {
  std::optional<c10::ScalarType> dtype;  ///< default: BFloat16 on CPU, Half on CUDA
  std::optional<bool> loss_scaling;      ///< default: on for Half, off for BFloat16
  double init_scale = 65536.0;
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  std::int64_t growth_interval = 2000;
};

class MixedPrecision : public Callback {
 public:
  explicit MixedPrecision(MixedPrecisionOptions options = {});
  ~MixedPrecision() override;
  std::string name() const override { return "mixed_precision"; }

  void before_fit() override;
  void before_batch() override;
  void after_pred() override;
  void after_loss() override;
  void before_backward() override;
  void before_step() override;
  void after_step() override;
  void after_cancel_batch() override;
  void after_batch() override;
  /// Capturable with bfloat16 (autocast is the thread's state at capture); float16's loss scaling reads back whether
  /// a gradient overflowed, to skip that step, so it runs eagerly.
  CaptureSupport step_capture() const override;
  void after_train() override;
  void after_validate() override;
  void after_epoch() override;
  void after_fit() override;

  /// The current loss scale (1 without loss scaling).
  double scale() const;
  /// Steps skipped because a gradient was not finite.
  std::int64_t skipped_steps() const { return skipped_; }
  c10::ScalarType dtype() const { return dtype_; }
  const MixedPrecisionOptions& options() const { return options_; }

 private:
  void enter_autocast();
  void exit_autocast();

  MixedPrecisionOptions options_;
  c10::DeviceType device_type_ = c10::DeviceType::CPU;
  c10::ScalarType dtype_ = c10::ScalarType::BFloat16;
  bool scaling_ = false;
  bool in_autocast_ = false;
  bool previous_enabled_ = false;
  c10::ScalarType previous_dtype_ = c10::ScalarType::BFloat16;
  at::Tensor scale_, growth_tracker_, found_inf_;
  bool unscaled_ = false;
  std::int64_t skipped_ = 0;
};

}  // namespace fastlearn
