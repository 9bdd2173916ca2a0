#pragma once
// TrainEval: the first callback of every Learner. Puts the model in training or evaluation mode and
// keeps the progress counters (train_iter, pct_train) that schedules read.
#include <fastlearn/learner/callback.h>
#include <fastlearn/learner/callback_order.h>

namespace fastlearn {

class TrainEval : public Callback {
 public:
  TrainEval() { order = cb_order::train_eval; }
  std::string name() const override { return "train_eval"; }
  void before_fit() override;
  void before_train() override;
  void after_batch() override;
  void before_validate() override;
};

}  // namespace fastlearn
