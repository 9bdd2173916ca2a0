#include <fastlearn/learner/callback.h>

#include <fastlearn/core/error.h>

namespace fastlearn {

std::string_view to_string(Event event) {
  switch (event) {
    case Event::before_fit:
      return "before_fit";
    case Event::before_epoch:
      return "before_epoch";
    case Event::before_train:
      return "before_train";
    case Event::before_batch:
      return "before_batch";
    case Event::after_pred:
      return "after_pred";
    case Event::after_loss:
      return "after_loss";
    case Event::before_backward:
      return "before_backward";
    case Event::after_cancel_backward:
      return "after_cancel_backward";
    case Event::after_backward:
      return "after_backward";
    case Event::before_step:
      return "before_step";
    case Event::after_cancel_step:
      return "after_cancel_step";
    case Event::after_step:
      return "after_step";
    case Event::after_cancel_batch:
      return "after_cancel_batch";
    case Event::after_batch:
      return "after_batch";
    case Event::after_cancel_train:
      return "after_cancel_train";
    case Event::after_train:
      return "after_train";
    case Event::before_validate:
      return "before_validate";
    case Event::after_cancel_validate:
      return "after_cancel_validate";
    case Event::after_validate:
      return "after_validate";
    case Event::after_cancel_epoch:
      return "after_cancel_epoch";
    case Event::after_epoch:
      return "after_epoch";
    case Event::after_cancel_fit:
      return "after_cancel_fit";
    case Event::after_fit:
      return "after_fit";
  }
  return "unknown event";
}

bool is_inner_loop(Event event) {
  switch (event) {
    case Event::before_batch:
    case Event::after_pred:
    case Event::after_loss:
    case Event::before_backward:
    case Event::after_cancel_backward:
    case Event::after_backward:
    case Event::before_step:
    case Event::after_cancel_step:
    case Event::after_step:
    case Event::after_cancel_batch:
    case Event::after_batch:
      return true;
    default:
      return false;
  }
}

bool is_in_step(Event event) {
  switch (event) {
    case Event::after_pred:
    case Event::after_loss:
    case Event::before_backward:
    case Event::after_cancel_backward:
    case Event::after_backward:
    case Event::before_step:
    case Event::after_cancel_step:
    case Event::after_step:
      return true;
    default:
      return false;
  }
}

std::vector<Event> Callback::in_step_events_handled() const {
  std::vector<Event> handled;
  for (auto e = static_cast<unsigned>(Event::before_fit); e <= static_cast<unsigned>(Event::after_fit); ++e)
    if ((in_step_received_ & ~in_step_defaulted_) & (1U << e)) handled.push_back(static_cast<Event>(e));
  return handled;
}

void Callback::handle(Event event) {
  if (is_in_step(event)) in_step_received_ |= 1U << static_cast<unsigned>(event);
  switch (event) {
    case Event::before_fit:
      return before_fit();
    case Event::before_epoch:
      return before_epoch();
    case Event::before_train:
      return before_train();
    case Event::before_batch:
      return before_batch();
    case Event::after_pred:
      return after_pred();
    case Event::after_loss:
      return after_loss();
    case Event::before_backward:
      return before_backward();
    case Event::after_cancel_backward:
      return after_cancel_backward();
    case Event::after_backward:
      return after_backward();
    case Event::before_step:
      return before_step();
    case Event::after_cancel_step:
      return after_cancel_step();
    case Event::after_step:
      return after_step();
    case Event::after_cancel_batch:
      return after_cancel_batch();
    case Event::after_batch:
      return after_batch();
    case Event::after_cancel_train:
      return after_cancel_train();
    case Event::after_train:
      return after_train();
    case Event::before_validate:
      return before_validate();
    case Event::after_cancel_validate:
      return after_cancel_validate();
    case Event::after_validate:
      return after_validate();
    case Event::after_cancel_epoch:
      return after_cancel_epoch();
    case Event::after_epoch:
      return after_epoch();
    case Event::after_cancel_fit:
      return after_cancel_fit();
    case Event::after_fit:
      return after_fit();
  }
}

Learner& Callback::learn() const {
  if (!learn_) throw Error("callback '" + name() + "' is not attached to a Learner; add it with Learner::add_cb");
  return *learn_;
}

}  // namespace fastlearn
