#pragma once
// GradientAccumulation: steps the optimizer once every n_acc items instead of every batch, so a
// small batch trains like a large one. Each batch's loss is scaled by bs / n_acc, gradients add up
// over the skipped steps, and zero_grad runs only after a real step. Learner::will_step tells the others.
#include <fastlearn/learner/callback.h>

#include <cstdint>

namespace fastlearn {

class GradientAccumulation : public Callback {
 public:
  /// Steps once `n_acc` items (not batches) have been accumulated.
  explicit GradientAccumulation(std::int64_t n_acc = 32);
  std::string name() const override { return "gradient_accumulation"; }
  void before_fit() override;
  void after_loss() override;
  void before_step() override;
  CaptureSupport step_capture() const override {
    return {.kind = StepCapture::eager_only,
            .why = "it decides on the host, batch by batch, whether the optimizer steps"};
  }

 private:
  std::int64_t n_acc_;
  std::int64_t count_ = 0;
};

}  // namespace fastlearn
