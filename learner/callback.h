#pragma once
// The callback system of the Learner (fastai semantics). The Learner fires an Event at every step of
// the loop; each attached Callback, sorted by `order`, gets the event through the virtual function of
// the same name and may read or change the learner's state. Control flow is steered by throwing one of
// the Cancel* exceptions; the Learner catches it at the end of the matching block.
#include <cstdint>
#include <exception>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace fastlearn {

class Learner;

/// Every event, in the order a normal fit fires them (after_cancel_X fires just before after_X).
enum class Event {
  before_fit,
  before_epoch,
  before_train,
  before_batch,
  after_pred,
  after_loss,
  before_backward,
  after_cancel_backward,
  after_backward,
  before_step,
  after_cancel_step,
  after_step,
  after_cancel_batch,
  after_batch,
  after_cancel_train,
  after_train,
  before_validate,
  after_cancel_validate,
  after_validate,
  after_cancel_epoch,
  after_epoch,
  after_cancel_fit,
  after_fit,
};

std::string_view to_string(Event event);

/// Events inside one batch: these honour a callback's run_train / run_valid flags.
bool is_inner_loop(Event event);
/// Events inside a training step, from after_pred to after_step: the events a step captured in a CUDA graph
/// (LearnerOptions::cuda_graph) fires once, at its capture; its replays repeat their kernels, not their host code.
bool is_in_step(Event event);

/// How a callback's work in the in-step events behaves when the Learner captures its training step in a CUDA graph.
enum class StepCapture {
  /// Decided at run time: fine while the callback handles no in-step event; one that does makes the steps run eagerly.
  undeclared,
  /// Its in-step work is device work, the same every step, that reads what changes from device memory: it runs once,
  /// at capture, and each replay repeats its kernels.
  capturable,
  /// It needs the host inside each step (a decision per batch, a value read back): the steps run eagerly.
  eager_only,
};

struct CaptureSupport {
  StepCapture kind = StepCapture::undeclared;
  std::string why;  ///< for eager_only: what needs the host, and the way out if there is one
};

/// Base of the control-flow exceptions; not an error, so it does not derive from fastlearn::Error.
class CancelException : public std::exception {
 public:
  const char* what() const noexcept override { return "fastlearn: training step cancelled by a callback"; }
};
/// Skips the rest of the batch (also zero_grad); after_cancel_batch and after_batch still run.
class CancelBatchException : public CancelException {};
/// Skips backward; the optimizer step and zero_grad still run.
class CancelBackwardException : public CancelException {};
/// Skips only the optimizer step; zero_grad still runs.
class CancelStepException : public CancelException {};
/// Ends the training part of the epoch; validation still runs.
class CancelTrainException : public CancelException {};
/// Ends the validation part of the epoch.
class CancelValidException : public CancelException {};
/// Ends the epoch; the next epoch starts.
class CancelEpochException : public CancelException {};
/// Ends the fit; after_cancel_fit and after_fit run.
class CancelFitException : public CancelException {};

class Callback {
 public:
  virtual ~Callback() = default;

  /// A short name for messages and lookups (default: "callback").
  virtual std::string name() const { return "callback"; }

  int order = 0;          ///< callbacks run sorted by order (stable: equal orders keep insertion order)
  bool run_train = true;  ///< receive inner-loop events while training
  bool run_valid = true;  ///< receive inner-loop events while validating
  bool run = true;        ///< set false to silence the callback until the end of the current fit

  /// True for callbacks that show or write something (progress, logs): in a data parallel job only the
  /// main process (Learner::Coordination::is_main) runs them. Such a callback must not steer the loop (throw a
  /// Cancel*Exception, change the lr): the other ranks would go on without it.
  virtual bool rank0_only() const { return false; }

  virtual void before_fit() {}
  virtual void before_epoch() {}
  virtual void before_train() {}
  virtual void before_batch() {}
  virtual void after_pred() { defaulted(Event::after_pred); }
  virtual void after_loss() { defaulted(Event::after_loss); }
  virtual void before_backward() { defaulted(Event::before_backward); }
  virtual void after_cancel_backward() { defaulted(Event::after_cancel_backward); }
  virtual void after_backward() { defaulted(Event::after_backward); }
  virtual void before_step() { defaulted(Event::before_step); }
  virtual void after_cancel_step() { defaulted(Event::after_cancel_step); }
  virtual void after_step() { defaulted(Event::after_step); }
  virtual void after_cancel_batch() {}
  virtual void after_batch() {}
  virtual void after_cancel_train() {}
  virtual void after_train() {}
  virtual void before_validate() {}
  virtual void after_cancel_validate() {}
  virtual void after_validate() {}
  virtual void after_cancel_epoch() {}
  virtual void after_epoch() {}
  virtual void after_cancel_fit() {}
  virtual void after_fit() {}

  /// Calls the function of `event`.
  void handle(Event event);

  /// How this callback's in-step events behave when the training step is captured (default: undeclared, decided by
  /// which in-step events it handles). Asked at each fit's first training batch, after before_fit.
  virtual CaptureSupport step_capture() const { return {}; }
  /// The in-step events this callback received and handled with a body of its own since forget_in_step_events().
  std::vector<Event> in_step_events_handled() const;
  void forget_in_step_events() { in_step_received_ = in_step_defaulted_ = 0; }

  /// The learner this callback is attached to; throws fastlearn::Error when it is not attached.
  Learner& learn() const;
  bool attached() const { return learn_ != nullptr; }

 private:
  friend class Learner;
  Learner* learn_ = nullptr;
  // Bits by Event: the in-step events received, and those that reached the base class's empty body.
  std::uint32_t in_step_received_ = 0;
  std::uint32_t in_step_defaulted_ = 0;
  void defaulted(Event event) { in_step_defaulted_ |= 1U << static_cast<unsigned>(event); }
};

using CallbackPtr = std::shared_ptr<Callback>;

}  // namespace fastlearn
