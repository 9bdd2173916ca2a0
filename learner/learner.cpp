#include <fastlearn/learner/learner.h>

#include <fastlearn/core/cpu_memory_cache.h>
#include <fastlearn/core/detail/mkl_dispatch.h>
#include <fastlearn/core/detail/text.h>
#include <fastlearn/core/device.h>
#include <fastlearn/core/error.h>
#include <fastlearn/data/sampler.h>
#include <fastlearn/learner/detail/step_graphs.h>
#include <fastlearn/learner/progress.h>
#include <fastlearn/learner/recorder.h>
#include <fastlearn/learner/train_eval.h>

#include <fmt/format.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <exception>
#include <set>

namespace fastlearn {

// --- small value types -------------------------------------------------------------------------

double ValidationResult::metric(const std::string& name) const {
  for (const auto& [n, v] : metrics) {
    if (n == name) return v;
  }
  std::string known;
  for (const auto& [n, v] : metrics) known += (known.empty() ? "" : ", ") + n;
  throw Error(fmt::format("ValidationResult: no metric '{}' (the learner's metrics are: {})", excerpt(name),
                          known.empty() ? "none" : known));
}

LrSpec LrSpec::slice(double stop) { return LrSpec(Kind::slice_stop, {stop}); }
LrSpec LrSpec::slice(double start, double stop) { return LrSpec(Kind::slice_range, {start, stop}); }

std::vector<double> LrSpec::per_group(std::size_t n_groups) const {
  if (n_groups == 0) return {};
  switch (kind_) {
    case Kind::values:
      if (values_.size() == 1) return std::vector<double>(n_groups, values_[0]);
      if (values_.size() != n_groups) {
        throw ConfigError(
            fmt::format("{} learning rates were given for {} parameter groups; give one for all or one "
                        "per group",
                        values_.size(), n_groups));
      }
      return values_;
    case Kind::slice_stop: {
      std::vector<double> lrs(n_groups, values_[0] / 10);
      lrs.back() = values_[0];
      return lrs;
    }
    case Kind::slice_range: {
      // fastai's even_mults: start * (stop/start)^(i/(n-1)).
      std::vector<double> lrs(n_groups, values_[1]);
      if (n_groups == 1) return lrs;
      const double step = std::pow(values_[1] / values_[0], 1.0 / static_cast<double>(n_groups - 1));
      for (std::size_t i = 0; i < n_groups; ++i) lrs[i] = values_[0] * std::pow(step, static_cast<double>(i));
      return lrs;
    }
  }
  return {};
}

std::int64_t find_bs(const std::vector<at::Tensor>& yb) {
  if (yb.empty()) return 0;
  return yb.front().dim() > 0 ? yb.front().size(0) : 1;
}

std::vector<at::Tensor> unique_params(const std::vector<at::Tensor>& params) {
  std::set<const void*> seen;
  std::vector<at::Tensor> out;
  for (const auto& p : params) {
    if (seen.insert(p.unsafeGetTensorImpl()).second) out.push_back(p);
  }
  return out;
}

std::vector<std::vector<at::Tensor>> trainable_params(torch::nn::Module& model) {
  return {unique_params(model.parameters())};
}

namespace {

// fastai's norm_types, recognised by the module's type name as torch::nn::Module::name() gives it.
bool is_norm_layer(const torch::nn::Module& m) {
  const auto& name = m.name();
  for (const char* kind : {"BatchNorm", "InstanceNorm", "LayerNorm"})
    if (name.find(kind) != std::string::npos) return true;
  return false;
}

void collect_norm_bias(torch::nn::Module& m, bool with_bias, std::vector<at::Tensor>& out) {
  if (is_norm_layer(m)) {
    for (const auto& p : m.parameters()) out.push_back(p);
    return;
  }
  for (const auto& child : m.children()) collect_norm_bias(*child, with_bias, out);
  if (!with_bias) return;
  for (const auto& item : m.named_parameters(/*recurse=*/false))
    if (item.key() == "bias") out.push_back(item.value());
}

}  // namespace

std::vector<at::Tensor> norm_bias_params(torch::nn::Module& model, bool with_bias) {
  std::vector<at::Tensor> out;
  collect_norm_bias(model, with_bias, out);
  return unique_params(out);
}

namespace detail {
void check_input_count(const std::vector<at::Tensor>& xb, std::size_t expected) {
  if (xb.size() != expected) {
    throw Error(
        fmt::format("the model's forward takes {} input tensor(s) but the batch has {}; make the dataset's "
                    "inputs match the model",
                    expected, xb.size()));
  }
}
}  // namespace detail

ScopedCallbacks::ScopedCallbacks(Learner& learn, std::vector<CallbackPtr> cbs) : learn_(learn), cbs_(std::move(cbs)) {
  std::size_t added = 0;
  try {
    for (; added < cbs_.size(); ++added) learn_.add_cb(cbs_[added]);
  } catch (...) {
    for (std::size_t i = 0; i < added; ++i) learn_.remove_cb(cbs_[i]);
    throw;
  }
}

ScopedCallbacks::~ScopedCallbacks() {
  for (const auto& cb : cbs_) learn_.remove_cb(cb);
}

// --- construction and callbacks ------------------------------------------------------------------

namespace {
ForwardOutputs one_output(Learner::Forward forward) {
  if (!forward) return nullptr;
  return [forward = std::move(forward)](const std::vector<at::Tensor>& xb) {
    return std::vector<at::Tensor>{forward(xb)};
  };
}
}  // namespace

Learner::Learner(DataLoaders dls, std::shared_ptr<torch::nn::Module> model, Forward forward, Loss loss_func,
                 LearnerOptions options)
    : Learner(std::move(dls), std::move(model), one_output(std::move(forward)), std::move(loss_func),
              std::move(options)) {}

Learner::Learner(DataLoaders dls, std::shared_ptr<torch::nn::Module> model, ForwardOutputs forward, Loss loss_func,
                 LearnerOptions options)
    : dls_(std::move(dls)),
      model_(std::move(model)),
      forward_(std::move(forward)),
      loss_func_(std::move(loss_func)),
      options_(std::move(options)) {
  if (!model_) throw Error("Learner: the model is null");
  if (!forward_) throw Error("Learner: the forward function is empty");
  if (!loss_func_.fn && !loss_func_.fn_all) throw Error("Learner: the loss function is empty");
  enable_cpu_memory_cache();  // a step's activations would otherwise cost fresh pages every time
  mkl_chooses_by_features();  // reports a bad FASTLEARN_MKL_BY_FEATURES here, where it can be thrown
  to(initial_device());
  add_cb(std::make_shared<TrainEval>());
  add_cb(std::make_shared<Recorder>(options_.metrics, RecorderOptions{.train_metrics = options_.train_metrics}));
  if (options_.progress) add_cb(std::make_shared<Progress>());
  add_cbs(options_.cbs);
}

// LearnerOptions::device resolved: the one given, else the loaders', else the model's when it is not on the CPU,
// else fastai's default (a GPU when one is visible).
c10::Device Learner::initial_device() const {
  if (options_.device) return resolve_device(*options_.device, "LearnerOptions::device");
  if (const auto loaders = dls_.device()) return resolve_device(*loaders, "the DataLoaders' device");
  for (const auto& p : model_->parameters())
    if (!p.device().is_cpu()) return p.device();
  for (const auto& b : model_->buffers())
    if (!b.device().is_cpu()) return b.device();
  return default_device();
}

void Learner::to(const c10::Device& device) {
  check_not_in_fit("to");
  model_->to(device);
  // A loader without a device hands out batches where its dataset holds them: on the CPU that is the same.
  if (!device.is_cpu() || dls_.device()) dls_.to(device);
  device_ = device;
}

Learner::Learner(std::shared_ptr<torch::nn::Module> model, Forward forward, Loss loss_func, LearnerOptions options)
    : Learner(DataLoaders::none(), std::move(model), std::move(forward), std::move(loss_func), std::move(options)) {}

Learner::Learner(std::shared_ptr<torch::nn::Module> model, ForwardOutputs forward, Loss loss_func,
                 LearnerOptions options)
    : Learner(DataLoaders::none(), std::move(model), std::move(forward), std::move(loss_func), std::move(options)) {}

Learner::~Learner() {
  steps_.reset();  // ends the steps' fit, which uses this learner, while it is whole
  for (auto& cb : cbs_) cb->learn_ = nullptr;
}

void Learner::add_cb(CallbackPtr cb) {
  if (!cb) throw Error("Learner::add_cb: null callback");
  if (cb->learn_) {
    throw Error("Learner::add_cb: callback '" + cb->name() + "' is already attached to " +
                (cb->learn_ == this ? "this Learner" : "another Learner"));
  }
  cb->learn_ = this;
  cbs_.push_back(std::move(cb));
  sort_cbs();
}

void Learner::add_cbs(const std::vector<CallbackPtr>& cbs) {
  for (const auto& cb : cbs) add_cb(cb);
}

void Learner::remove_cb(const CallbackPtr& cb) {
  auto it = std::find(cbs_.begin(), cbs_.end(), cb);
  if (it == cbs_.end()) return;
  (*it)->learn_ = nullptr;
  cbs_.erase(it);
}

Learner::StepGradients Learner::step_gradients() {
  if (auto shares = coordination_.gradient_shares ? coordination_.gradient_shares() : std::nullopt)
    return {.tensors = std::move(*shares), .shares = true};
  StepGradients out;
  for (auto& group : opt().param_groups())
    for (auto& p : group.params)
      if (p.grad().defined()) out.tensors.push_back(p.mutable_grad());
  return out;
}

void Learner::sort_cbs() {
  std::stable_sort(cbs_.begin(), cbs_.end(),
                   [](const CallbackPtr& a, const CallbackPtr& b) { return a->order < b->order; });
}

Recorder& Learner::recorder() const {
  auto rec = cb<Recorder>();
  if (!rec) throw Error("Learner: the Recorder callback was removed; lr_find, validate and the logs need it");
  return *rec;
}

std::vector<at::Tensor> Learner::forward_outputs(const std::vector<at::Tensor>& inputs) {
  auto outputs = forward_(inputs);
  if (outputs.empty() || !outputs[0].defined()) throw Error("Learner: the model's forward returned no tensor");
  return outputs;
}

std::vector<at::Tensor> Learner::all_preds() const {
  std::vector<at::Tensor> out{pred};
  out.insert(out.end(), extra_preds.begin(), extra_preds.end());
  return out;
}

ForwardOutputs Learner::set_forward(ForwardOutputs forward) {
  std::swap(forward_, forward);
  return forward;
}

Learner::Backward Learner::set_backward(Backward backward) {
  std::swap(backward_, backward);
  return backward;
}

ModelCopy Learner::replicate(const c10::Device& device) {
  const std::string type = model_->name();
  if (!options_.replicate) {
    throw ConfigError(fmt::format(
        "the model ({}) cannot be copied to another device: a Learner made from a module and a Forward has no way to "
        "copy it; give LearnerOptions::replicate (a function that makes one more such model and its forward)",
        excerpt(type)));
  }
  ModelCopy copy;
  try {
    copy = options_.replicate(*model_, device);
  } catch (const std::exception& e) {
    const auto* torch_error = dynamic_cast<const c10::Error*>(&e);  // without LibTorch's backtrace
    throw ConfigError(fmt::format(
        "the model ({}) cannot be copied to {}: {}. Derive the model's modules from torch::nn::Cloneable, or give "
        "LearnerOptions::replicate (a function that makes one more such model and its forward)",
        excerpt(type), device.str(), excerpt(torch_error ? torch_error->what_without_backtrace() : e.what(), 400)));
  }
  if (!copy.model || !copy.forward) {
    throw ConfigError(fmt::format(
        "the model ({}) cannot be copied to {}: LearnerOptions::replicate returned no model or no forward{}",
        excerpt(type), device.str(), copy.model ? "" : " (clone() gave a module of another type?)"));
  }
  return copy;
}

void Learner::fire(Event event) {
  // A copy, so that callbacks may add or remove callbacks while the event runs.
  const auto cbs = cbs_;
  const bool inner = is_inner_loop(event);
  for (const auto& cb : cbs) {
    if (!cb->run || cb->learn_ != this || (cb->rank0_only() && !coordination_.is_main())) continue;
    if (inner && !((cb->run_train && training) || (cb->run_valid && !training))) continue;
    cb->handle(event);
  }
  if (event == Event::after_fit) {
    for (const auto& cb : cbs) cb->run = true;
  }
}

template <typename Cancel, typename Body>
void Learner::with_events(Body&& body, Event before, Event after_cancel, Event after) {
  try {
    fire(before);
    body();
  } catch (const Cancel&) {
    fire(after_cancel);
  }
  fire(after);
}

// --- optimizer and parameter groups --------------------------------------------------------------

std::vector<std::vector<at::Tensor>> Learner::param_groups() {
  auto groups = options_.splitter ? options_.splitter(*model_) : trainable_params(*model_);
  if (groups.empty()) throw Error("Learner: the splitter returned no parameter group");
  return groups;
}

void Learner::create_opt() {
  opt_ = options_.opt_func(param_groups(), options_.lr);
  if (options_.wd) opt_->set_hyper("wd", *options_.wd);
  if (!options_.wd_bn_bias) opt_->exempt_from_weight_decay(norm_bias_params(*model_));
}

Optimizer& Learner::opt() {
  if (!opt_) throw Error("Learner: no optimizer yet; fit() or create_opt() makes one");
  return *opt_;
}

void Learner::freeze_to(int n) {
  auto groups = param_groups();
  const int count = static_cast<int>(groups.size());
  const int frozen = std::clamp(n < 0 ? n + count : n, 0, count);
  std::set<const void*> norm;  // parameters of normalization layers
  if (options_.train_bn) {
    for (const auto& p : norm_bias_params(*model_, /*with_bias=*/false)) norm.insert(p.unsafeGetTensorImpl());
  }
  for (int g = 0; g < count; ++g) {
    for (auto& p : groups[g]) {
      p.set_requires_grad(g >= frozen || norm.contains(p.unsafeGetTensorImpl()));
      if (!p.requires_grad()) p.mutable_grad() = at::Tensor();
    }
  }
  // As fastai: the optimizer state starts over after freezing or unfreezing; its hyper-parameters stay,
  // and it is replaced at once so that a callback may (un)freeze in the middle of a fit.
  if (opt_) {
    auto old = std::move(opt_);
    create_opt();
    if (opt_->n_groups() == old->n_groups()) {
      for (std::size_t g = 0; g < old->n_groups(); ++g) opt_->param_groups()[g].hypers = old->param_groups()[g].hypers;
    }
  }
}

// --- the loop --------------------------------------------------------------------------------------

void Learner::check_not_in_fit(const char* what) const {
  if (in_fit_) throw Error(fmt::format("Learner::{} was called during a fit (from a callback?)", what));
}

void Learner::fit(int n_epoch_, std::optional<LrSpec> lr, FitOptions options) {
  check_not_in_fit("fit");
  if (options.reset_opt || !opt_) create_opt();
  const auto lrs = lr.value_or(LrSpec(options_.lr)).per_group(opt_->n_groups());
  options.reset_opt = false;
  run_fit(n_epoch_, lrs, std::move(options));
}

void Learner::run_fit(int n_epoch_, const std::vector<double>& lrs, FitOptions options) {
  if (n_epoch_ < 0) throw ConfigError(fmt::format("fit: n_epoch must be >= 0, got {}", n_epoch_));
  if (options.start_epoch < 0 || options.start_epoch > n_epoch_) {
    throw ConfigError(fmt::format("fit: start_epoch {} is outside [0, {}]", options.start_epoch, n_epoch_));
  }
  if (options.epoch_offset < 0) {
    throw ConfigError(fmt::format("fit: epoch_offset must be >= 0, got {}", options.epoch_offset));
  }
  check_not_in_fit("fit");
  if (n_epoch_ > options.start_epoch) check_train_batches();
  if (!opt_) create_opt();
  phase = options.phase;  // load_resume_point checks the checkpoint's against these
  epoch_offset = options.epoch_offset;
  if (!options.resume_from.empty()) options.start_epoch = load_resume_point(options.resume_from, n_epoch_);
  ScopedCallbacks extra(*this, std::move(options.cbs));
  if (auto wd = options.wd ? options.wd : options_.wd) opt_->set_hyper("wd", *wd);
  opt_->set_hyper("lr", lrs);
  n_epoch = n_epoch_;
  epoch = options.start_epoch;
  epochs_completed_ = options.start_epoch;
  in_fit_ = true;
  training_stopped_ = false;
  struct EndCleanup {  // also when an exception leaves the fit
    Learner& l;
    int exceptions = std::uncaught_exceptions();
    ~EndCleanup() {
      if (std::uncaught_exceptions() > exceptions && l.coordination_.fit_failed) {
        try {
          l.coordination_.fit_failed();
        } catch (...) {  // the exception in flight is the one to report
        }
      }
      l.in_fit_ = false;
      l.resume_.reset();
      l.dl = nullptr;
      l.xb.clear(), l.yb.clear();
      l.pred = l.loss = l.loss_grad = at::Tensor();
      l.extra_preds.clear();
      l.step_graph_stats_ = l.step_graph_stats();
      l.step_graphs_.reset();  // the graphs read this fit's callbacks' tensors too
    }
  } cleanup{.l = *this};
  step_graph_stats_ = {};
  if (options_.cuda_graph) step_graphs_ = std::make_unique<StepGraphs>();
  with_events<CancelFitException>([&] { do_fit(options.start_epoch); }, Event::before_fit, Event::after_cancel_fit,
                                  Event::after_fit);
}

// Without this, an epoch of no batch would "train" with a NaN loss, change nothing and end as a success.
void Learner::check_train_batches() const {
  const auto& train = dls_.train();
  if (train.size() > 0) return;
  const auto& o = train.options();
  throw DataError(
      fmt::format("fit: the training DataLoader makes no batch: {} item(s) per epoch{} with bs {}{}; "
                  "use a smaller bs or more data",
                  train.n(), train.n() < train.dataset().size() ? " (this process's share)" : "", o.bs,
                  o.drop_last ? " and drop_last (a smaller last batch is dropped)" : ""));
}

void Learner::do_fit(int start_epoch) {
  for (epoch = start_epoch; epoch < n_epoch; ++epoch) {
    try {
      fire(Event::before_epoch);
      do_epoch();
    } catch (const CancelEpochException&) {
      fire(Event::after_cancel_epoch);
    }
    epochs_completed_ = epoch + 1;  // before after_epoch, so a checkpoint saved there resumes after it
    fire(Event::after_epoch);
  }
}

void Learner::do_epoch() {
  do_epoch_train();
  do_epoch_validate(dls_.valid());
}

void Learner::do_epoch_train() {
  dl = &dls_.train();
  with_events<CancelTrainException>([&] { all_batches(dls_.train()); }, Event::before_train, Event::after_cancel_train,
                                    Event::after_train);
}

void Learner::do_epoch_validate(DataLoader& loader) {
  dl = &loader;
  torch::NoGradGuard no_grad;
  with_events<CancelValidException>([&] { all_batches(loader); }, Event::before_validate, Event::after_cancel_validate,
                                    Event::after_validate);
}

void Learner::all_batches(DataLoader& loader) {
  n_iter = loader.size();
  std::int64_t skip = 0;
  if (resume_ && training && &loader == &dls_.train()) {
    // Continue the interrupted epoch: its first batches were trained before the checkpoint was taken.
    // They are still drawn (the order and augmentation seeds are per batch) but not used.
    skip = resume_->batch;
    if (skip > 0) {
      pct_train = resume_->pct_train;
      train_iter = resume_->train_iter;
    }
    if (auto rec = cb<Recorder>()) {
      auto state = resume_->recorder;
      if (skip == 0) state.loss_sum = 0, state.loss_count = 0;
      rec->restore_epoch_state(state);
    }
    resume_.reset();
    // The program's batches (the step API): those trained before the checkpoint are not asked for again.
    if (skip > 0 && steps_ && loader.dataset().per_process()) skip_step_batches(skip);
  }
  std::int64_t i = 0;
  for (const Batch& batch : loader) {
    if (i < skip) {
      ++i;
      continue;
    }
    one_batch(i++, batch);
  }
}

void Learner::one_batch(std::int64_t i, const Batch& batch) {
  iter = i;
  will_step = true;
  xb = batch.inputs;
  yb = batch.targets;
  with_events<CancelBatchException>([&] { do_one_batch(); }, Event::before_batch, Event::after_cancel_batch,
                                    Event::after_batch);
}

void Learner::do_one_batch() {
  if (!step_graphs_ || !training || yb.empty()) return do_step();
  step_graphs_->run(*this, [this] { do_step(); });
}

StepGraphStats Learner::step_graph_stats() const {
  if (!step_graphs_) return step_graph_stats_;
  const auto& plan = step_graphs_->plan();
  return {.captures = plan.captures(),
          .replays = plan.replays(),
          .eager_steps = plan.eager_steps(),
          .eager_because = plan.why()};
}

void Learner::do_step() {
  const auto outputs = forward_outputs(xb);
  pred = outputs[0];
  extra_preds.assign(outputs.begin() + 1, outputs.end());
  fire(Event::after_pred);
  if (!yb.empty()) {
    loss_grad = loss_func_(all_preds(), yb);
    loss = loss_grad.detach().clone();  // a copy: callbacks may scale loss_grad in place
  }
  fire(Event::after_loss);
  if (!training || yb.empty()) return;
  do_grad_opt();
}

void Learner::do_grad_opt() {
  with_events<CancelBackwardException>(
      [&] {
        if (backward_) {
          backward_(loss_grad);
        } else {
          loss_grad.backward();
        }
      },
      Event::before_backward, Event::after_cancel_backward, Event::after_backward);
  with_events<CancelStepException>([&] { opt_->step(); }, Event::before_step, Event::after_cancel_step,
                                   Event::after_step);
  opt_->zero_grad();
}

// --- evaluation ----------------------------------------------------------------------------------

ValidationResult Learner::validate(DataLoader* loader) {
  check_not_in_fit("validate");
  DataLoader* target = loader ? loader : &dls_.valid();
  release_in_order_copy();  // made anew at each call: the loader's sampler or transforms may have changed since
  if (target->options().shuffle || target->options().drop_last) {
    auto options = target->options();
    options.shuffle = false;
    options.drop_last = false;
    options.seed = target->seed();
    in_order_ = std::make_unique<DataLoader>(target->dataset_ptr(), std::move(options));
    // A sampler of the user's own (a subset, say) stays; only the loader's own shuffling goes, and a data
    // parallel share it may still carry after a cancelled fit.
    auto sampler = target->sampler_ptr();
    if (auto whole = sampler->undistributed()) sampler = std::move(whole);
    if (!dynamic_cast<const RandomSampler*>(sampler.get())) in_order_->set_sampler(std::move(sampler));
    target = in_order_.get();
  }
  struct Restore {  // also when validation throws
    Learner& l;
    bool was_training;
    ~Restore() {
      l.dl = nullptr;
      l.model_->train(was_training);
    }
  } restore{*this, model_->is_training()};
  do_epoch_validate(*target);
  ValidationResult result{.loss = recorder().last_valid_loss()};
  const auto& values = recorder().last_valid_metrics();
  for (std::size_t i = 0; i < options_.metrics.size() && i < values.size(); ++i) {
    result.metrics.emplace_back(options_.metrics[i]->name(), values[i]);
  }
  return result;
}

void Learner::release_in_order_copy() {
  if (!in_order_) return;
  if (coordination_.forget_loader) coordination_.forget_loader(*in_order_);  // a trainer may still hold it wrapped
  in_order_.reset();
}

Preds Learner::get_preds(DataLoader* loader) {
  auto& rec = recorder();
  rec.keep_valid_preds(true);
  struct Restore {  // also when validation throws
    Recorder& rec;
    ~Restore() { rec.keep_valid_preds(false); }
  } restore{rec};
  validate(loader);
  Preds out;
  // In a data parallel job, the Recorder gathered every rank's share (in dataset order, padding removed).
  const auto& preds = rec.last_valid_preds();
  if (preds.empty()) return out;
  out.preds = loss_func_.activate(preds[0]);
  out.extra_preds.assign(preds.begin() + 1, preds.end());
  const auto& targets = rec.last_valid_targets();
  if (!targets.empty()) {
    out.targets = targets[0];
    out.extra_targets.assign(targets.begin() + 1, targets.end());
  }
  out.decoded = loss_func_.decode(out.preds);
  return out;
}

Prediction Learner::predict(const Item& item) {
  Batch batch = collate({item});
  // The validation loader's batch transforms make the item look like what the model was trained on.
  at::Generator generator = at::detail::createCPUGenerator(0);
  for (const auto& tfm : dls_.valid().options().batch_tfms) tfm(batch, generator);
  if (auto device = dls_.device()) batch = batch.to(*device);
  const auto probs = activations_in_eval(batch.inputs)[0];
  return {.decoded = loss_func_.decode(probs)[0], .probs = probs[0]};
}

std::vector<at::Tensor> Learner::activations_in_eval(const std::vector<at::Tensor>& inputs) {
  torch::NoGradGuard no_grad;
  struct RestoreMode {
    torch::nn::Module& m;
    bool was_training;
    ~RestoreMode() { m.train(was_training); }
  } restore{*model_, model_->is_training()};
  model_->eval();
  auto outputs = forward_outputs(inputs);
  outputs[0] = loss_func_.activate(outputs[0]);
  return outputs;
}

}  // namespace fastlearn
