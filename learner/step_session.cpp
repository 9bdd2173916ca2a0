// The step API of the Learner (learner/step_session.h): a fit on a fiber of the program's own thread whose training
// loader yields the batches the program hands to train_step, one at a time, in turns with the program's code.
#include <fastlearn/learner/step_session.h>

#include <fastlearn/core/detail/fiber.h>
#include <fastlearn/core/detail/parallel.h>
#include <fastlearn/core/detail/text.h>
#include <fastlearn/core/detail/warning.h>
#include <fastlearn/core/error.h>
#include <fastlearn/data/dataset.h>
#include <fastlearn/data/detail/buffer_pool.h>
#include <fastlearn/learner/callback.h>
#include <fastlearn/learner/learner.h>
#include <fastlearn/models/detail/dropout_scope.h>

#include <ATen/ThreadLocalState.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <fmt/format.h>
#include <torch/torch.h>

#include <deque>
#include <exception>
#include <limits>
#include <mutex>
#include <optional>
#include <thread>

namespace fastlearn {

namespace {

// What of the thread's state belongs to one side, the fit or the program, while the other runs: each sees its own
// grad mode, autocast, current device, OpenMP team size, dropout generator and loader buffer pool.
struct ThreadSide {
  std::optional<at::ThreadLocalState> aten;  // grad and inference mode, autocast, saved-tensor hooks, ...
  std::optional<c10::DeviceIndex> device;    // the current device of the Learner's device type (none on the CPU)
  int team = 0;                              // 0: leave it
  std::optional<at::Generator> dropout;
  BufferPool* pool = nullptr;
};

// Makes `next` the thread's state and returns what it was.
ThreadSide exchange(ThreadSide next, c10::DeviceType type) {
  ThreadSide was;
  was.aten.emplace();
  if (next.aten) at::ThreadLocalState::setThreadLocalState(*next.aten);
  if (type != c10::DeviceType::CPU) {
    const auto* impl = c10::impl::getDeviceGuardImpl(type);
    was.device = impl->getDevice().index();
    if (next.device && *next.device != *was.device) impl->setDevice(c10::Device(type, *next.device));
  }
  was.team = team_size();
  if (next.team > 0 && next.team != was.team) set_team_size(next.team);
  was.dropout = models::exchange_dropout_scope(std::move(next.dropout));
  was.pool = exchange_buffer_pool(next.pool);
  return was;
}

// The state a thread starts with (grad mode on, no autocast, ...): the fit's at its start, as when it had a thread of
// its own, whatever guards the program holds around begin_steps. The team is the program's.
ThreadSide fresh_side() {
  ThreadSide side;
  std::thread([&] { side.aten.emplace(); }).join();  // no ATen work there: no OpenMP team starts
  side.team = team_size();
  return side;
}

}  // namespace

class StepRunner {
 public:
  StepRunner(Learner& learn, StepPlan plan, StepFit fit) : learn_(learn), plan_(plan), fit_(std::move(fit)) {}

  ~StepRunner() {
    try {
      finish();
    } catch (...) {  // the error was the program's to see at its last train_step or end_steps
    }
  }
  StepRunner(const StepRunner&) = delete;
  StepRunner& operator=(const StepRunner&) = delete;

  // Starts the fit and returns once it waits for the first batch; its error (before_fit's) is rethrown.
  void start(int n_epoch) {
    saved_train_.emplace(learn_.dls().train());
    // bs 1 over plan.steps_per_epoch "items": one batch per handed-over batch; seeded, so that making it draws
    // nothing from torch's generator (a fit fed the same batches by a loader draws the same numbers).
    learn_.dls().train() = DataLoader(std::make_shared<Source>(*this), {.bs = 1, .seed = 0});
    loss_cb_ = std::make_shared<LastLoss>();
    learn_.add_cb(loss_cb_);
    if (plan_.held_out > 0) {
      saved_valid_.emplace(learn_.dls().valid());
      held_out_cb_ = std::make_shared<HeldOutValidation>(*this);
      learn_.add_cb(held_out_cb_);
    }
    fit_side_ = fresh_side();
    fiber_ = std::make_unique<Fiber>([this, n_epoch] { run(n_epoch); });
    enter();
    if (fiber_->finished()) {
      finish();  // rethrows the fit's error
      throw Error("begin_steps: the fit ended before its first step");
    }
  }

  at::Tensor step(std::vector<at::Tensor> inputs, std::vector<at::Tensor> targets) {
    check_caller("train_step");
    const std::lock_guard one_at_a_time(calls_);  // from several threads: each waits for the step before
    if (fiber_->finished()) throw ended();
    handed_.emplace(Batch{std::move(inputs), std::move(targets)});
    enter();          // taken, trained, and what follows it done: the fit waits for the next batch, or has ended
    handed_.reset();  // not taken when the fit ended before asking for it
    ++steps_;
    if (fiber_->finished() && error_) finish_holding_the_call();
    return loss_cb_->loss;
  }

  // Ends the fit (early: as a cancelled fit) and rethrows its error; puts the training loader back.
  void finish() {
    check_caller("end_steps");
    const std::lock_guard one_at_a_time(calls_);
    finish_holding_the_call();
  }

  void finish_holding_the_call() {
    if (fiber_ && fiber_->started() && !fiber_->finished()) {
      stop_ = true;
      enter();  // next_batch ends the fit with CancelFitException
    }
    if (loss_cb_ && loss_cb_->attached()) learn_.remove_cb(loss_cb_);
    if (held_out_cb_ && held_out_cb_->attached()) learn_.remove_cb(held_out_cb_);
    if (saved_valid_) {
      learn_.dls().valid() = std::move(*saved_valid_);
      saved_valid_.reset();
    }
    if (saved_train_) {
      learn_.dls().train() = std::move(*saved_train_);
      saved_train_.reset();
    }
    if (auto error = std::exchange(error_, nullptr)) std::rethrow_exception(error);
  }

  // Error when the fit's own code (a callback) calls: the program drives the steps.
  void check_caller(const char* what) const {
    if (fiber_ && fiber_->inside())
      throw Error(
          fmt::format("{} was called from inside the steps' fit (a callback?); call it from the program", what));
  }

  bool finished() const { return !fiber_ || fiber_->finished(); }
  std::int64_t steps() const { return steps_; }

  bool holds_out() const { return plan_.held_out > 0; }

  // Puts the loaders the steps set aside into `dls`.
  void set_aside_into(DataLoaders& dls) const {
    if (saved_train_) dls.train() = *saved_train_;
    if (saved_valid_) dls.valid() = *saved_valid_;
  }
  // Adds the rows of a batch to the held-out samples, keeping the last plan.held_out.
  void hold_out(const std::vector<at::Tensor>& inputs, const std::vector<at::Tensor>& targets) {
    const Batch rows{inputs, targets};
    const auto n = rows.size();
    for (const auto& t : inputs)
      if (t.dim() == 0 || t.size(0) != n) throw DataError("hold_out: every tensor needs the same number of rows");
    for (const auto& t : targets)
      if (t.dim() == 0 || t.size(0) != n) throw DataError("hold_out: every tensor needs the same number of rows");
    const std::lock_guard lock(held_mutex_);
    for (std::int64_t i = 0; i < n; ++i) {
      Item row;
      for (const auto& t : inputs) row.inputs.push_back(t[i].detach().to(at::kCPU).clone());
      for (const auto& t : targets) row.targets.push_back(t[i].detach().to(at::kCPU).clone());
      if (!held_.empty() &&
          (row.inputs.size() != held_.front().inputs.size() || row.targets.size() != held_.front().targets.size()))
        throw DataError("hold_out: the samples have another number of tensors than those held out before");
      held_.push_back(std::move(row));
      if (static_cast<std::int64_t>(held_.size()) > plan_.held_out) held_.pop_front();
    }
  }

  // The held-out samples, stacked: "input<i>" and "target<i>" (none when there are none).
  NamedTensors held_out_tensors() {
    const std::lock_guard lock(held_mutex_);
    NamedTensors out;
    if (held_.empty()) return out;
    const auto batch = collate(std::vector<Item>(held_.begin(), held_.end()));
    for (std::size_t i = 0; i < batch.inputs.size(); ++i) out.emplace_back(fmt::format("input{}", i), batch.inputs[i]);
    for (std::size_t i = 0; i < batch.targets.size(); ++i)
      out.emplace_back(fmt::format("target{}", i), batch.targets[i]);
    return out;
  }

  // Puts back what held_out_tensors gave (checked by the caller: the same first dimension everywhere).
  void restore_held_out(const NamedTensors& tensors) {
    std::vector<at::Tensor> inputs, targets;
    for (const auto& [name, t] : tensors) (name.starts_with("input") ? inputs : targets).push_back(t);
    const std::lock_guard lock(held_mutex_);
    held_.clear();
    const auto n = inputs.empty() ? 0 : inputs.front().size(0);
    for (std::int64_t i = std::max<std::int64_t>(0, n - plan_.held_out); i < n; ++i) {
      Item row;
      for (const auto& t : inputs) row.inputs.push_back(t[i].clone());
      for (const auto& t : targets) row.targets.push_back(t[i].clone());
      held_.push_back(std::move(row));
    }
  }

  // A resumed fit's first `n` batches were trained before its checkpoint: they come back empty, without the program.
  void skip(std::int64_t n) { skip_ = n; }

 private:
  // The training items: each batch is the one the program hands over (taken inside the fit's fiber).
  class Source : public Dataset {
   public:
    explicit Source(StepRunner& runner) : runner_(runner) {}
    std::int64_t size() const override { return runner_.plan_.steps_per_epoch; }
    Item get(std::int64_t) const override { throw Error("the steps' items are the program's batches"); }
    Batch load_batch(std::span<const std::int64_t>, at::Generator&) const override { return runner_.next_batch(); }
    bool per_process() const override { return true; }

   private:
    StepRunner& runner_;
  };

  // The loss of the last training batch.
  struct LastLoss : Callback {
    LastLoss() {
      order = 100;  // after every other callback, which may change learn().loss
      run_valid = false;
    }
    std::string name() const override { return "last_loss"; }
    // Taken once computed too: a callback that ends the fit at this batch's end (GracefulStop) cuts after_batch short.
    void after_loss() override { loss = learn().loss; }
    // At capture it keeps the graph's loss; after_batch then takes the step's own.
    CaptureSupport step_capture() const override { return {.kind = StepCapture::capturable, .why = {}}; }
    void after_batch() override { loss = learn().loss; }
    at::Tensor loss;
  };

  // Before each validation: the validation loader becomes one over the held-out samples as they are now. First, so
  // that the callbacks after it (a DistributedTrainer sharing the loader out) see that loader.
  struct HeldOutValidation : Callback {
    explicit HeldOutValidation(StepRunner& runner) : runner_(runner) { order = -100; }
    std::string name() const override { return "held_out_validation"; }
    void before_validate() override {
      if (learn().dl != &learn().dls().valid()) return;  // get_preds / validate on a loader of the caller's
      auto tensors = runner_.held_out_tensors();
      std::vector<at::Tensor> inputs, targets;
      for (auto& [name, t] : tensors) (name.starts_with("input") ? inputs : targets).push_back(std::move(t));
      std::shared_ptr<const Dataset> items;
      if (inputs.empty()) {
        if (!warned_) {  // a program that forgot hold_out would otherwise see validation losses of NaN, silently
          warn(
              fmt::format("the steps hold out {} sample(s) for validation (StepPlan::held_out, data.held_out), and "
                          "none was held out by the end of epoch {}: its validation has nothing to read; hand "
                          "samples over with hold_out (fl_hold_out), or hold none out",
                          runner_.plan_.held_out, learn().epoch_offset + learn().epoch));
          warned_ = true;
        }
        items = DataLoaders::none().valid().dataset_ptr();
      } else
        items = std::make_shared<TensorDataset>(std::move(inputs), std::move(targets));
      learn().dls().valid() = DataLoader(std::move(items), {.bs = runner_.plan_.valid_bs, .seed = 0});
    }
    StepRunner& runner_;
    bool warned_ = false;
  };

  Batch next_batch() {
    if (skip_ > 0) {
      --skip_;
      return {};
    }
    fiber_->suspend();  // back to the program: train_step returns, and the next one resumes here
    if (stop_ || !handed_) throw CancelFitException();  // end_steps before the planned steps: a cancelled fit
    Batch batch = std::move(*handed_);
    handed_.reset();
    return batch.to(learn_.device());
  }

  void run(int n_epoch) {
    try {
      const c10::DeviceGuard device(learn_.device());  // the fit's current device: the Learner's
      if (fit_)
        fit_(learn_, n_epoch);
      else
        learn_.fit_one_cycle(n_epoch);
    } catch (...) {
      error_ = std::current_exception();
    }
  }

  // Runs the fit until it waits for a batch or ends, with the fit's thread state; the program's is put back after.
  void enter() {
    const auto type = learn_.device().type();
    auto program = exchange(std::move(fit_side_), type);
    struct Back {  // also if the switch fails
      StepRunner& self;
      ThreadSide& program;
      c10::DeviceType type;
      ~Back() { self.fit_side_ = exchange(std::move(program), type); }
    } back{*this, program, type};
    fiber_->resume();
  }

  Error ended() const {
    return Error(fmt::format("train_step: the steps have ended ({} of {} trained{}); begin_steps starts more", steps_,
                             plan_.steps, learn_.training_stopped() ? ", stopped by a callback" : ""));
  }

  Learner& learn_;
  const StepPlan plan_;
  const StepFit fit_;
  std::optional<DataLoader> saved_train_;
  std::shared_ptr<LastLoss> loss_cb_;
  std::unique_ptr<Fiber> fiber_;  // the fit
  std::mutex calls_;              // one train_step or end_steps at a time
  ThreadSide fit_side_;           // the fit's thread state while the program runs
  std::optional<Batch> handed_;
  bool stop_ = false;
  std::exception_ptr error_;
  std::int64_t steps_ = 0;
  std::int64_t skip_ = 0;
  std::optional<DataLoader> saved_valid_;
  std::shared_ptr<HeldOutValidation> held_out_cb_;
  std::mutex held_mutex_;
  std::deque<Item> held_;  // the last plan.held_out samples set aside (on the CPU)
};

void Learner::begin_steps(StepPlan plan, StepFit fit) {
  if (steps_ && !steps_->finished()) throw Error("begin_steps: steps are under way; end_steps() first");
  end_steps();  // those that ended by themselves: their loader back, their error thrown
  check_not_in_fit("begin_steps");
  if (plan.steps <= 0) throw ConfigError(fmt::format("begin_steps: steps must be positive, got {}", plan.steps));
  if (plan.steps_per_epoch == 0) plan.steps_per_epoch = plan.steps;
  if (plan.steps_per_epoch < 0 || plan.steps % plan.steps_per_epoch != 0)
    throw ConfigError(fmt::format("begin_steps: steps_per_epoch {} must divide steps {} (the epochs are whole)",
                                  plan.steps_per_epoch, plan.steps));
  const auto epochs = plan.steps / plan.steps_per_epoch;
  if (epochs > std::numeric_limits<int>::max())
    throw ConfigError(fmt::format("begin_steps: {} epochs of {} steps are too many", epochs, plan.steps_per_epoch));
  steps_ = std::make_shared<StepRunner>(*this, plan, std::move(fit));  // set first: the fit asks for it
  try {
    steps_->start(static_cast<int>(epochs));
  } catch (...) {
    steps_.reset();
    throw;
  }
}

at::Tensor Learner::train_step(std::vector<at::Tensor> inputs, std::vector<at::Tensor> targets) {
  if (!steps_) throw Error("train_step: no steps under way; begin_steps(plan) starts them");
  if (inputs.empty() || targets.empty()) throw DataError("train_step: a batch needs its inputs and its targets");
  return steps_->step(std::move(inputs), std::move(targets));
}

void Learner::end_steps() {
  if (!steps_) return;
  steps_->check_caller("end_steps");  // before letting go: the fit cannot end itself from inside
  auto runner = std::move(steps_);
  runner->finish();
}

void Learner::skip_step_batches(std::int64_t n) { steps_->skip(n); }

void Learner::hold_out(const std::vector<at::Tensor>& inputs, const std::vector<at::Tensor>& targets) {
  if (!steps_) throw Error("hold_out: no steps under way; begin_steps(plan) starts them");
  if (!steps_->holds_out()) throw ConfigError("hold_out: the steps' plan holds no sample out (StepPlan::held_out)");
  steps_->hold_out(inputs, targets);
}

NamedTensors Learner::step_state() const {
  return steps_ && steps_->holds_out() ? steps_->held_out_tensors() : NamedTensors{};
}

void Learner::restore_step_state(const NamedTensors& tensors) {
  if (steps_ && steps_->holds_out()) steps_->restore_held_out(tensors);
}

bool Learner::stepping() const { return steps_ && !steps_->finished(); }

DataLoaders Learner::given_dls() const {
  auto dls = dls_;
  if (steps_) steps_->set_aside_into(dls);
  return dls;
}

at::Tensor Learner::predict_batch(std::vector<at::Tensor> inputs) {
  return predict_batch_outputs(std::move(inputs))[0];
}

std::vector<at::Tensor> Learner::predict_batch_outputs(std::vector<at::Tensor> inputs) {
  if (in_fit_ && !steps_) throw Error("predict_batch was called during a fit (from a callback?)");
  for (auto& x : inputs) x = x.to(device_);
  return activations_in_eval(inputs);
}

}  // namespace fastlearn
