#include <fastlearn/callbacks/grad_accumulation.h>

#include <fastlearn/core/error.h>
#include <fastlearn/learner/callback_order.h>
#include <fastlearn/learner/learner.h>

namespace fastlearn {

GradientAccumulation::GradientAccumulation(std::int64_t n_acc) : n_acc_(n_acc) {
  if (n_acc <= 0) throw ConfigError("GradientAccumulation: n_acc must be > 0 items");
  order = cb_order::grad_accumulation;
  run_valid = false;
}

void GradientAccumulation::before_fit() { count_ = 0; }

void GradientAccumulation::after_loss() {
  auto& l = learn();
  const auto bs = find_bs(l.yb);
  l.will_step = count_ + bs >= n_acc_;
  l.loss_grad = l.loss_grad * (static_cast<double>(bs) / static_cast<double>(n_acc_));
}

void GradientAccumulation::before_step() {
  count_ += find_bs(learn().yb);
  if (count_ < n_acc_) throw CancelBatchException();  // skips the step and zero_grad
  count_ = 0;
}

}  // namespace fastlearn
