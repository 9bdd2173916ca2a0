#include <fastlearn/learner/train_eval.h>

#include <fastlearn/learner/learner.h>

namespace fastlearn {

void TrainEval::before_fit() {
  auto& l = learn();
  // A resumed fit (start_epoch > 0) continues its schedules where the interrupted one stopped.
  l.train_iter = static_cast<std::int64_t>(l.epoch) * l.dls().train().size();
  l.pct_train = l.n_epoch > 0 ? static_cast<double>(l.epoch) / l.n_epoch : 0.0;
}

void TrainEval::before_train() {
  auto& l = learn();
  l.pct_train = static_cast<double>(l.epoch) / l.n_epoch;
  l.model().train();
  l.training = true;
}

void TrainEval::after_batch() {
  auto& l = learn();
  if (!l.training) return;
  l.pct_train += 1.0 / (static_cast<double>(l.n_iter) * l.n_epoch);
  ++l.train_iter;
}

void TrainEval::before_validate() {
  auto& l = learn();
  l.model().eval();
  l.training = false;
}

}  // namespace fastlearn
