#pragma once
// Learner: trains a torch::nn module on DataLoaders with a loss, an optimizer and metrics, firing the
// events of learner/callback.h at every step (fastai's loop; ARCHITECTURE.md "One batch"):
//
//   fit:    before_fit, then per epoch { before_epoch,
//             train:    before_train, per batch { one batch }, after_train,
//             validate: before_validate, per batch { one batch, no grad }, after_validate,
//           after_epoch }, after_fit
//   batch:  before_batch, pred = model(xb), after_pred, loss = loss_func(pred, yb), after_loss,
//           then when training: before_backward, backward, after_backward, before_step, opt.step(),
//           after_step, opt.zero_grad(); finally after_batch.
//
// Every block X runs before_X, its body, after_cancel_X if a callback threw CancelXException, then
// always after_X. Callbacks read and change the public loop state below (xb, yb, pred, loss, ...).
#include <fastlearn/data/dataloaders.h>
#include <fastlearn/learner/callback.h>
#include <fastlearn/learner/checkpoint.h>
#include <fastlearn/learner/loss.h>
#include <fastlearn/learner/metrics.h>
#include <fastlearn/learner/step_session.h>
#include <fastlearn/optim/adam.h>

#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include <array>
#include <concepts>
#include <filesystem>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace fastlearn {

class Recorder;
class StepGraphs;
class StepRunner;

/// Splits a model's parameters into groups (for discriminative learning rates and freezing).
using Splitter = std::function<std::vector<std::vector<at::Tensor>>(torch::nn::Module&)>;
/// Items in a batch, as fastai's find_bs: the first dimension of the first target (0 without targets).
std::int64_t find_bs(const std::vector<at::Tensor>& yb);

/// `params` without repeats (a weight shared by two layers appears once), in first-seen order.
std::vector<at::Tensor> unique_params(const std::vector<at::Tensor>& params);

/// The default splitter: one group with every parameter.
std::vector<std::vector<at::Tensor>> trainable_params(torch::nn::Module& model);

/// fastai's norm_bias_params: the parameters of every normalization layer (batch, instance and layer norm; a
/// SyncBatchNorm is a batch norm) and, with `with_bias`, every other module's own "bias". The default Learner
/// gives them no weight decay (LearnerOptions::wd_bn_bias) and keeps the normalization layers trainable in frozen
/// groups (LearnerOptions::train_bn).
std::vector<at::Tensor> norm_bias_params(torch::nn::Module& model, bool with_bias = true);

/// A learning rate for every parameter group: one value for all, one value per group, or fastai's slice.
class LrSpec {
 public:
  LrSpec(double lr) : values_{lr} {}  // NOLINT: implicit on purpose, fit(1, 1e-3) reads naturally
  LrSpec(std::vector<double> per_group) : values_(std::move(per_group)) {}
  /// fastai's slice(stop): stop / 10 for every group but the last, which gets stop.
  static LrSpec slice(double stop);
  /// fastai's slice(start, stop): geometrically spaced from start (first group) to stop (last group).
  static LrSpec slice(double start, double stop);
  /// The value of each of `n_groups` groups; ConfigError if a per-group list has another length.
  std::vector<double> per_group(std::size_t n_groups) const;

 private:
  enum class Kind { values, slice_stop, slice_range };
  LrSpec(Kind kind, std::vector<double> values) : kind_(kind), values_(std::move(values)) {}
  Kind kind_ = Kind::values;
  std::vector<double> values_;
};

/// Runs a model on a batch's inputs and returns each of its outputs (one for most models).
using ForwardOutputs = std::function<std::vector<at::Tensor>(const std::vector<at::Tensor>& xb)>;

/// A second copy of a model, with the function that runs it on a batch's inputs (see LearnerOptions::replicate).
struct ModelCopy {
  std::shared_ptr<torch::nn::Module> model;
  ForwardOutputs forward;
};

/// Makes a copy of `model` on `device`: the same architecture; its values need not match, the caller copies them.
using Replicate = std::function<ModelCopy(torch::nn::Module& model, const c10::Device& device)>;

struct LearnerOptions {
  OptFunc opt_func = Adam();
  double lr = 1e-3;                ///< default learning rate of fit()
  std::optional<double> wd;        ///< weight decay for every fit; default: the optimizer's
  std::vector<MetricPtr> metrics;  ///< computed on the validation set each epoch
  std::vector<CallbackPtr> cbs;    ///< extra callbacks for every fit
  Splitter splitter;               ///< parameter groups; default: one group
  std::filesystem::path path = ".";
  std::string model_dir = "models";  ///< save() / load() use path / model_dir / <name>.safetensors
  bool train_bn = true;     ///< normalization layers' parameters stay trainable in frozen groups (fastai's train_bn)
  bool wd_bn_bias = false;  ///< weight decay also on norm_bias_params (fastai's wd_bn_bias; by default they get none)
  std::array<double, 3> moms{0.95, 0.85, 0.95};  ///< one-cycle momentum: start, middle, end
  bool progress = true;        ///< attach the Progress callback (bars on a TTY, epoch lines otherwise)
  bool train_metrics = false;  ///< also compute the metrics on the training set
  /// Where the model, its optimizer state and the batches are. Default (auto, as fastai): the loaders' device when
  /// they have one, else the model's when it is not on the CPU, else default_device() (core/device.h: a GPU when
  /// one is visible). "cuda" without an index is the GPU default_device() picks.
  std::optional<c10::Device> device;
  /// How to copy the model for replicas on several devices of one process (ParallelTrainer). Default: with the
  /// typed constructor, the module's clone() (every built-in model clones; a model of your own clones when it and
  /// its submodules derive from torch::nn::Cloneable); with a module and a Forward, none, so give one.
  Replicate replicate;
  /// The config keys that build this model again, as TOML ([data] dataset and task, [model] arch and options): what
  /// an export records so that load_learner can rebuild the model from the registry. Set by learner_from_config,
  /// vision_learner and tabular_learner; empty for a model of your own (load_learner then takes a factory).
  std::string model_recipe;
  /// Capture each training step (forward, loss, backward, optimizer step) in a CUDA graph and replay it: on a GPU a
  /// step is then one launch instead of one per kernel, which is what bounds small models (docs/gpu.md, "Training
  /// steps as CUDA graphs"). After warm-up steps each batch shape is captured once; the events inside the step run at
  /// capture only, and a callback that needs the host there makes the fit's steps run eagerly, with one warning that
  /// names it (Callback::step_capture). On the CPU the steps run eagerly.
  bool cuda_graph = false;
};

/// What LearnerOptions::cuda_graph did in the last fit (all 0 without it).
struct StepGraphStats {
  std::int64_t captures = 0;     ///< graphs captured: one per batch shape, again after what they read moved
  std::int64_t replays = 0;      ///< training steps run as a replay (the step of each capture included)
  std::int64_t eager_steps = 0;  ///< training steps run eagerly (warm-up, a parameter's first update, fallbacks)
  std::string eager_because;     ///< why the fit's steps ran eagerly; empty when they could be captured
};

struct FitOptions {
  std::optional<double> wd;
  std::vector<CallbackPtr> cbs;  ///< callbacks for this fit only
  bool reset_opt = false;        ///< a fresh optimizer (state cleared)
  int start_epoch = 0;           ///< skip the epochs before this one (resume); schedules continue from there
  /// A checkpoint to continue from (see callbacks/checkpointing.h): model, optimizer, RNG, data order and,
  /// when it has a fit position, the epoch and batch it was taken at (start_epoch is then ignored). A fit
  /// of the same length resumed this way gives the same results, bit for bit on CPU, as one not interrupted.
  std::filesystem::path resume_from;
  /// The part of a longer training this fit is (fine_tune: "frozen", then "unfrozen"; empty: a plain fit). Its
  /// checkpoints record it, and a fit resumes only from a checkpoint of the same part.
  std::string phase;
  /// Epochs of that training before this fit (fine_tune's unfrozen fit: freeze_epochs): the epoch numbers of
  /// the records, logs and checkpoint file names count on from there instead of restarting at 0.
  int epoch_offset = 0;
};

struct OneCycleOptions {
  double div = 25.0;                          ///< initial lr = lr_max / div
  double div_final = 1e5;                     ///< final lr = lr_max / div_final
  double pct_start = 0.25;                    ///< fraction of the steps spent warming up
  std::optional<std::array<double, 3>> moms;  ///< default: LearnerOptions::moms
  FitOptions fit;
};

struct FlatCosOptions {
  double div_final = 1e5;
  double pct_start = 0.75;  ///< fraction of the steps at the flat lr before the cosine decay
  FitOptions fit;
};

/// fit.resume_from may be a checkpoint of either fit: one of the unfrozen fit skips the frozen fit.
struct FineTuneOptions {
  int freeze_epochs = 1;
  double lr_mult = 100;  ///< the first group trains at base_lr / lr_mult after unfreezing
  double pct_start = 0.3;
  double div = 5.0;
  FitOptions fit;
};

struct LrFindOptions {
  double start_lr = 1e-7;
  double end_lr = 10;
  int num_it = 100;                           ///< at least 6
  bool stop_div = true;                       ///< stop when the smoothed loss exceeds 4x the best one
  std::optional<std::filesystem::path> plot;  ///< write the loss-vs-lr plot (SVG) there
};

struct LrFindResult {
  // The suggestions of fastai's lr_find, computed on the curve below (learner/lr_finder.h explains each).
  double valley = 0;           ///< fastai's default: the middle of the longest descent (cautious: often early)
  double slide = 0;            ///< where the loss stops falling steadily, found from the end of the curve
  double minimum = 0;          ///< the lr of the lowest loss / 10 (the classic rule; what the README example uses)
  double steep = 0;            ///< the steepest descent per decade of lr
  std::vector<double> lrs;     ///< every lr tried
  std::vector<double> losses;  ///< the smoothed loss at each
};

struct ValidationResult {
  double loss = std::numeric_limits<double>::quiet_NaN();
  std::vector<std::pair<std::string, double>> metrics;
  /// The value of metric `name`; Error when there is no such metric.
  double metric(const std::string& name) const;
};

struct Preds {
  at::Tensor preds;    ///< activations (softmax for cross entropy), in the loader's order
  at::Tensor targets;  ///< yb[0] of every batch
  at::Tensor decoded;  ///< preds decoded by the loss (argmax for cross entropy)
  /// A model of several outputs: its outputs after the first, as it returns them (the loss's activation is the
  /// first's); empty otherwise.
  std::vector<at::Tensor> extra_preds;
  /// A batch of several targets: yb[1], yb[2], ... of every batch; empty otherwise.
  std::vector<at::Tensor> extra_targets;
};

struct Prediction {
  at::Tensor decoded;  ///< e.g. the class index
  at::Tensor probs;    ///< the activations
};

/// Callbacks attached for one scope; removed by the destructor.
class [[nodiscard]] ScopedCallbacks {
 public:
  ScopedCallbacks(Learner& learn, std::vector<CallbackPtr> cbs);
  ~ScopedCallbacks();
  ScopedCallbacks(const ScopedCallbacks&) = delete;
  ScopedCallbacks& operator=(const ScopedCallbacks&) = delete;

 private:
  Learner& learn_;
  std::vector<CallbackPtr> cbs_;
};

class Learner {
 public:
  using Forward = std::function<at::Tensor(const std::vector<at::Tensor>& xb)>;
  using ForwardOutputs = fastlearn::ForwardOutputs;
  using Backward = std::function<void(const at::Tensor& loss_grad)>;

  /// Any torch::nn module holder whose forward takes one Tensor, two Tensors, or a vector of them, and returns a
  /// Tensor or a vector of them (a model of several outputs: the loss then needs Loss::fn_all).
  template <typename ModuleHolder>
  Learner(DataLoaders dls, ModuleHolder model, Loss loss_func, LearnerOptions options = {});
  /// A module and the function that runs it on a batch's inputs.
  Learner(DataLoaders dls, std::shared_ptr<torch::nn::Module> model, Forward forward, Loss loss_func,
          LearnerOptions options = {});
  /// A module and the function that runs it on a batch's inputs and returns each of its outputs.
  Learner(DataLoaders dls, std::shared_ptr<torch::nn::Module> model, ForwardOutputs forward, Loss loss_func,
          LearnerOptions options = {});
  /// Without data: for the step API (begin_steps, train_step) and predict_batch; its loaders hold no items, so fit()
  /// refuses to start and validate() has nothing to read until dls() gets loaders of items.
  template <typename ModuleHolder>
  Learner(ModuleHolder model, Loss loss_func, LearnerOptions options = {});
  Learner(std::shared_ptr<torch::nn::Module> model, Forward forward, Loss loss_func, LearnerOptions options = {});
  Learner(std::shared_ptr<torch::nn::Module> model, ForwardOutputs forward, Loss loss_func,
          LearnerOptions options = {});
  ~Learner();
  Learner(const Learner&) = delete;
  Learner& operator=(const Learner&) = delete;

  // --- training -------------------------------------------------------------------------------
  /// `n_epoch` epochs at a constant learning rate (default: options().lr).
  void fit(int n_epoch, std::optional<LrSpec> lr = {}, FitOptions options = {});
  /// The 1cycle policy: lr warms up from lr_max/div to lr_max (cosine), then anneals to lr_max/div_final;
  /// momentum goes the opposite way (0.95 -> 0.85 -> 0.95).
  void fit_one_cycle(int n_epoch, std::optional<LrSpec> lr_max = {}, OneCycleOptions options = {});
  /// A flat lr for pct_start of the steps, then cosine annealing to lr/div_final.
  void fit_flat_cos(int n_epoch, std::optional<LrSpec> lr = {}, FlatCosOptions options = {});
  /// fastai's fine_tune: freeze, one-cycle for freeze_epochs, unfreeze, one-cycle with discriminative lrs.
  /// The two fits are the phases "frozen" and "unfrozen", the second's epochs numbered after the first's; with
  /// fit.resume_from it resumes from a checkpoint of either (one of the unfrozen fit skips the frozen fit). When
  /// the frozen fit ends with stop_training() (GracefulStop, on a signal), the unfrozen fit does not start; early
  /// stopping ends the frozen fit only.
  void fine_tune(int epochs, double base_lr = 2e-3, FineTuneOptions options = {});
  /// Trains with an exponentially growing lr and suggests one; model and optimizer are restored afterwards.
  LrFindResult lr_find(LrFindOptions options = {});

  // --- evaluation -----------------------------------------------------------------------------
  /// Loss and metrics on every item of `dl` (default: the validation loader), once each. A loader that shuffles
  /// or drops its last batch (the training loader) is read through an in-order copy of it, as fastai's
  /// validate and get_preds read `dl.new(shuffled=False, drop_last=False)`; its batch transforms stay.
  ValidationResult validate(DataLoader* dl = nullptr);
  /// Predictions and targets of every item of `dl` (default: the validation loader), in dataset order (the
  /// sampler's, for a loader given a sampler of its own).
  Preds get_preds(DataLoader* dl = nullptr);
  /// The prediction for one item (no batch dimension).
  Prediction predict(const Item& item);

  /// fastai's learn.export (`export` is a C++ keyword): the model and what inference needs (learner/export.h) in
  /// one safetensors file, `file` relative to options().path; load_learner reads it. In a job of several the main
  /// process (rank 0) writes it and the others return at once, without a collective: rank 0 may call it alone (as
  /// `if (fl::rank() == 0) learn.export_to(...)`), the weights being the same on every rank. Returns the path.
  std::filesystem::path export_to(const std::filesystem::path& file = "export.safetensors", double threshold = 0.5);

  // --- training inside a running program (learner/step_session.h) -----------------------------
  /// Starts plan.steps training steps that the program hands over one batch at a time: one of the Learner's fits
  /// (`fit`, default fit_one_cycle at options().lr) over plan.steps / plan.steps_per_epoch epochs, every event and
  /// callback as in a fit, validation on dls().valid() after each epoch. The fit runs in turns with the program, on
  /// the thread that calls begin_steps, train_step or end_steps (one at a time, as the program's loop does). Returns
  /// once the fit waits for its first batch (a before_fit error is thrown here).
  void begin_steps(StepPlan plan, StepFit fit = {});
  /// One training step on the program's batch; returns its loss (detached, on the Learner's device: reading it on
  /// the host waits for a GPU). When the step ends an epoch, validation and the epoch's callbacks run before it
  /// returns; after the last planned step, the fit's end too. Error once the steps have ended.
  at::Tensor train_step(std::vector<at::Tensor> inputs, std::vector<at::Tensor> targets);
  at::Tensor train_step(const at::Tensor& x, const at::Tensor& y) {
    return train_step(std::vector<at::Tensor>{x}, std::vector<at::Tensor>{y});
  }
  /// Ends the steps (before the planned number: as a cancelled fit, after_cancel_fit then after_fit) and gives the
  /// training loader back; rethrows the steps' error. Nothing when none are under way.
  void end_steps();
  /// Whether steps are under way and not ended (a callback such as GracefulStop or EarlyStopping may end them).
  bool stepping() const;
  /// Sets the rows of a batch aside for validation (StepPlan::held_out keeps the last ones); call it from the thread
  /// that calls train_step. Error without steps under way, or when the plan holds none out.
  void hold_out(const std::vector<at::Tensor>& inputs, const std::vector<at::Tensor>& targets);
  /// The model's activations (the loss's: softmax for cross entropy) on a batch of inputs, in eval mode without
  /// gradients; between training steps too. A model of several outputs: its first.
  at::Tensor predict_batch(std::vector<at::Tensor> inputs);
  /// As predict_batch, every output of the model: the first activated by the loss, the others as the model returns
  /// them.
  std::vector<at::Tensor> predict_batch_outputs(std::vector<at::Tensor> inputs);

  // --- callbacks ------------------------------------------------------------------------------
  void add_cb(CallbackPtr cb);
  void add_cbs(const std::vector<CallbackPtr>& cbs);
  /// Detaches `cb`; it receives no further event, also within the event running now.
  void remove_cb(const CallbackPtr& cb);
  /// Attaches `cbs` until the returned guard goes out of scope.
  ScopedCallbacks added_cbs(std::vector<CallbackPtr> cbs) { return ScopedCallbacks(*this, std::move(cbs)); }
  const std::vector<CallbackPtr>& cbs() const { return cbs_; }
  /// The first attached callback of type T, or nullptr.
  template <typename T>
  std::shared_ptr<T> cb() const;
  /// The Recorder; Error when it was removed.
  Recorder& recorder() const;

  // --- model, optimizer, data -----------------------------------------------------------------
  torch::nn::Module& model() { return *model_; }
  std::shared_ptr<torch::nn::Module> model_ptr() const { return model_; }
  /// Runs the model on a batch's inputs (through set_forward's replacement, if any): its first output.
  at::Tensor forward(const std::vector<at::Tensor>& inputs) { return forward_outputs(inputs).at(0); }
  /// Every output of the model on a batch's inputs (one for most models).
  std::vector<at::Tensor> forward_outputs(const std::vector<at::Tensor>& inputs);
  /// Replaces how the model is run (for wrappers such as data parallel); returns the previous one.
  ForwardOutputs set_forward(ForwardOutputs forward);
  /// Replaces how the loss is back-propagated in a training step (default, empty: loss_grad.backward()); returns the
  /// previous one. For wrappers whose forward ran elsewhere (ParallelTrainer's replicas).
  Backward set_backward(Backward backward);
  /// A copy of the model on `device`, made as LearnerOptions::replicate says; ConfigError naming the model's type
  /// and that option when the model cannot be copied.
  ModelCopy replicate(const c10::Device& device);
  DataLoaders& dls() { return dls_; }
  /// The DataLoaders the Learner was given: dls(), except during steps, whose loaders of the program's batches and
  /// held-out samples stand in for the training and validation loaders set aside (what an export describes).
  DataLoaders given_dls() const;
  /// Where this learner computes: LearnerOptions::device, resolved.
  const c10::Device& device() const { return device_; }
  /// Whether LearnerOptions::device was left to fastlearn (data parallel training then moves the learner to its
  /// rank's GPU under NCCL).
  bool device_is_auto() const { return !options_.device; }
  /// Moves the model and the loaders' batches to `device`; the optimizer's state follows at its next step.
  void to(const c10::Device& device);
  const Loss& loss_func() const { return loss_func_; }
  const std::vector<MetricPtr>& metrics() const { return options_.metrics; }
  const LearnerOptions& options() const { return options_; }
  /// What LearnerOptions::cuda_graph did in the last (or the running) fit.
  StepGraphStats step_graph_stats() const;

  /// Creates the optimizer over the splitter's parameter groups (done by fit when there is none).
  void create_opt();
  bool has_opt() const { return opt_ != nullptr; }
  /// Discards the optimizer and its state (the next fit creates a fresh one).
  void drop_opt() { opt_.reset(); }
  /// The optimizer; Error when none was created yet.
  Optimizer& opt();
  /// Parameter groups as the splitter makes them.
  std::vector<std::vector<at::Tensor>> param_groups();
  /// Freezes the groups before `n` (negative counts from the end): no gradients, except BatchNorm's
  /// when train_bn. freeze() = freeze_to(-1), unfreeze() = freeze_to(0). The optimizer keeps its
  /// hyper-parameters but its state starts over (as fastai); allowed from a callback during a fit.
  void freeze_to(int n);
  void freeze() { freeze_to(-1); }
  void unfreeze() { freeze_to(0); }

  // --- checkpoints ----------------------------------------------------------------------------
  /// path / model_dir / <name>.safetensors
  std::filesystem::path checkpoint_path(const std::string& name) const;
  /// Writes a checkpoint atomically and returns its path. In a job of several rank 0 writes it and the others
  /// return at once, without a collective: rank 0 may call it alone.
  std::filesystem::path save(const std::string& name, SaveOptions options = {});
  /// Loads a checkpoint written by save(); CheckpointError naming the tensor on any mismatch. In a job of several
  /// it is collective: every rank calls it, and each reads the file once every rank has come (so the file rank 0
  /// saved before is complete).
  void load(const std::string& name, LoadOptions options = {});
  /// Epochs finished in the fit that was running when the last loaded checkpoint was saved (resume point).
  int epochs_completed() const { return epochs_completed_; }
  /// Asks that training end with the fit that is running, not only that fit: a callback that stops the run
  /// (GracefulStop, on a signal) calls it before cancelling the fit, and fine_tune then does not start its
  /// unfrozen fit. A fit cancelled otherwise (early stopping) ends only itself, as in fastai. Cleared when a fit
  /// starts.
  void stop_training() { training_stopped_ = true; }
  bool training_stopped() const { return training_stopped_; }
  /// Whether a fit is running (between its before_fit and its end, also one that ends by an exception).
  bool in_fit() const { return in_fit_; }
  /// Sets the resume point (restore_state does, from a checkpoint's metadata).
  void set_epochs_completed(int epochs) { epochs_completed_ = epochs; }

  /// How this learner cooperates with the other processes of a data parallel job (set by the
  /// DistributedTrainer; the defaults are those of a single process).
  struct Coordination {
    int rank = 0;  ///< this process's rank among those training together
    /// The process that shows progress and writes files (save(), logs, checkpoints): rank 0.
    bool is_main() const { return rank == 0; }
    std::function<void()> barrier;  ///< load() and a resume wait here before reading (save() does not wait)
    /// Turns this process's per-item predictions of the last validation pass into those of the whole set.
    std::function<at::Tensor(const at::Tensor&)> gather_items;
    /// How many of this process's items in the current pass, in batch order, come before the padding that evens out
    /// the processes' shares: per-item sums over these, added over the processes, are the whole set's. nullopt when
    /// the pass's items are not shared out (each process's own, per_process datasets).
    std::function<std::optional<std::int64_t>()> own_items;
    /// Collective: true when any process passes true (so that all stop at the same point); once per epoch.
    std::function<bool(bool)> any_process;
    /// Per batch, without a collective of its own: `mine` travels with the next gradient all-reduce, and
    /// the answer is true on every process at the same batch once any process passed true (one or two
    /// training batches later; see GradReducer::vote).
    std::function<bool(bool)> any_process_soon;
    /// Collective: every process's `row` (1-D, the same size on all), stacked in rank order.
    std::function<at::Tensor(const at::Tensor&)> all_gather_rows;
    /// Gives `loader` back (its own sampler and seed) if it is still wrapped for this process's share; called
    /// before the Learner frees a loader of its own.
    std::function<void(DataLoader&)> forget_loader;
    /// Sharded gradients (DistributedTrainerOptions::shard = "gradients"): this process's shares of the step's
    /// gradients, 1-d pieces that stand for the parameters' .grad (dropped then); nullopt while the parameters' .grad
    /// holds the step's gradients. Whatever reads gradients (clipping, overflow checks) reads these when given.
    std::function<std::optional<std::vector<at::Tensor>>()> gradient_shares;
    /// Called by every process before a collective save (the optimizer's state sharded): fails within moments when
    /// a process does not arrive, naming `what`, instead of waiting in the gather until the collective timeout.
    std::function<void(const std::string& what)> enter_collective;
    /// Collective: `t` (a few elements) becomes its sum over the processes, or its maximum when `max`; in place.
    std::function<void(const at::Tensor& t, bool max)> reduce_over_processes;
    /// Sharded parameters (shard = "parameters"): true while the model's parameters are split over the processes
    /// (during a fit, from its first training batch); a model tensor is then read through whole_model_tensor.
    std::function<bool()> model_sharded;
    /// A model tensor made whole for reading, its unit gathered (collective: every process asks for the same tensors
    /// in the same order); valid until the next call or the next step.
    std::function<at::Tensor(const at::Tensor&)> whole_model_tensor;
    /// Called when an exception leaves a fit (whose after_fit then does not run): puts right, without a collective,
    /// what only the end of the fit would have undone.
    std::function<void()> fit_failed;
  };
  Coordination& coordination() { return coordination_; }
  /// The gradients the optimizer steps with, for callbacks that read or scale them before the step (clipping, an
  /// overflow check): this process's shares when data parallel training shards the gradients (`shares` true: a
  /// figure over them must be reduced over the processes, Coordination::reduce_over_processes), else the defined
  /// .grad of the optimizer's parameters, each once (also when layers share a weight).
  struct StepGradients {
    std::vector<at::Tensor> tensors;
    bool shares = false;
  };
  StepGradients step_gradients();

  // --- loop state (fastai's names); callbacks read and may change these ------------------------
  std::vector<at::Tensor> xb;           ///< inputs of the current batch
  std::vector<at::Tensor> yb;           ///< targets of the current batch
  at::Tensor pred;                      ///< model output (its first, for a model of several outputs)
  std::vector<at::Tensor> extra_preds;  ///< a model of several outputs: those after the first (the loss reads them)
  /// pred, then extra_preds: every output of the model on this batch.
  std::vector<at::Tensor> all_preds() const;
  at::Tensor loss_grad;  ///< the loss backward runs on
  at::Tensor loss;       ///< a detached copy of the loss, for logging
  int epoch = 0;
  int n_epoch = 0;
  int epoch_offset = 0;     ///< FitOptions::epoch_offset of the fit: its epoch `epoch` is epoch_offset + epoch overall
  std::string phase;        ///< FitOptions::phase of the fit
  std::int64_t iter = 0;    ///< batch index in the current loader
  std::int64_t n_iter = 0;  ///< batches in the current loader
  std::int64_t train_iter = 0;  ///< training batches since the start of the fit
  double pct_train = 0;         ///< fraction of the fit's training done, in [0, 1]
  bool training = false;
  /// False when this training batch only accumulates gradients and the optimizer will not step (set by
  /// GradientAccumulation at after_loss; data parallel training then skips communicating them).
  bool will_step = true;
  double smooth_loss = std::numeric_limits<double>::quiet_NaN();  ///< set by the Recorder
  DataLoader* dl = nullptr;                                       ///< the loader being iterated

 private:
  template <typename Body>
  void with_events(Body&& body, Event before, Event after_cancel, Event after);
  template <typename Cancel, typename Body>
  void with_events(Body&& body, Event before, Event after_cancel, Event after);
  void fire(Event event);
  void run_fit(int n_epoch, const std::vector<double>& lrs, FitOptions options);
  void check_train_batches() const;
  void do_fit(int start_epoch);
  void do_epoch();
  void do_epoch_train();
  void do_epoch_validate(DataLoader& loader);
  void all_batches(DataLoader& loader);
  int load_resume_point(const std::filesystem::path& file, int n_epoch);  // in learner/checkpoint.cpp
  void one_batch(std::int64_t i, const Batch& batch);
  void do_one_batch();
  void do_step();  // the body of do_one_batch, which StepGraphs may run, capture or replay
  void do_grad_opt();
  void sort_cbs();
  void check_not_in_fit(const char* what) const;
  c10::Device initial_device() const;
  std::vector<at::Tensor> activations_in_eval(const std::vector<at::Tensor>& inputs);  // no grad, eval mode

  DataLoaders dls_;
  std::shared_ptr<torch::nn::Module> model_;
  ForwardOutputs forward_;
  Backward backward_;
  Loss loss_func_;
  LearnerOptions options_;
  std::unique_ptr<Optimizer> opt_;
  c10::Device device_{c10::kCPU};
  std::vector<CallbackPtr> cbs_;  // sorted by order
  int epochs_completed_ = 0;
  bool in_fit_ = false;
  bool training_stopped_ = false;
  std::optional<FitPosition> resume_;  // set by a fit resumed inside an epoch until that epoch's training starts
  // The in-order copy the last validate() read (see validate); a DistributedTrainer may still hold it wrapped,
  // so it is freed through Coordination::forget_loader.
  std::unique_ptr<DataLoader> in_order_;
  void release_in_order_copy();
  Coordination coordination_;
  friend class StepRunner;
  std::unique_ptr<StepGraphs> step_graphs_;  // during a fit with options_.cuda_graph
  StepGraphStats step_graph_stats_;          // of the last fit, kept when step_graphs_ goes
  friend CheckpointState capture_state(Learner& learn, SaveOptions options);
  friend StateToSave capture_state_to_save(Learner& learn, SaveOptions options);
  friend void restore_state(Learner& learn, const CheckpointState& state, LoadOptions options, std::string_view origin);
  std::shared_ptr<StepRunner> steps_;      // the steps under way (begin_steps)
  void skip_step_batches(std::int64_t n);  // in learner/step_session.cpp
  NamedTensors step_state() const;         // the held-out samples, for checkpoints
  void restore_step_state(const NamedTensors& tensors);
};

// --- implementation details of the templates ------------------------------------------------

namespace detail {
/// Throws when a model that takes `expected` inputs gets another number.
void check_input_count(const std::vector<at::Tensor>& xb, std::size_t expected);

/// A model's output as the Learner's outputs: a Tensor, or a vector of them.
template <typename Output>
std::vector<at::Tensor> as_outputs(Output&& out) {
  if constexpr (std::convertible_to<Output, at::Tensor>) {
    return {at::Tensor(std::forward<Output>(out))};
  } else {
    return std::vector<at::Tensor>(std::forward<Output>(out));
  }
}

template <typename ModuleHolder>
ForwardOutputs forward_of(ModuleHolder model) {
  if constexpr (requires(ModuleHolder m, at::Tensor t) { m->forward(t); }) {
    return [model](const std::vector<at::Tensor>& xb) mutable {
      check_input_count(xb, 1);
      return as_outputs(model->forward(xb[0]));
    };
  } else if constexpr (requires(ModuleHolder m, at::Tensor t) { m->forward(t, t); }) {
    return [model](const std::vector<at::Tensor>& xb) mutable {
      check_input_count(xb, 2);
      return as_outputs(model->forward(xb[0], xb[1]));
    };
  } else {
    static_assert(
        requires(ModuleHolder m, std::vector<at::Tensor> v) { m->forward(v); },
        "the model's forward must take one Tensor, two Tensors, or a std::vector<Tensor>");
    return [model](const std::vector<at::Tensor>& xb) mutable { return as_outputs(model->forward(xb)); };
  }
}

template <typename ModuleHolder>
Replicate replicate_of() {
  return [](torch::nn::Module& model, const c10::Device& device) -> ModelCopy {
    using Module = typename ModuleHolder::ContainedType;
    auto copy = std::dynamic_pointer_cast<Module>(model.clone(device));
    if (!copy) return {};  // clone() gave another type: Learner::replicate says so
    return {.model = copy, .forward = forward_of(ModuleHolder(copy))};
  };
}
}  // namespace detail

template <typename ModuleHolder>
Learner::Learner(DataLoaders dls, ModuleHolder model, Loss loss_func, LearnerOptions options)
    : Learner(std::move(dls), model.ptr(), detail::forward_of(model), std::move(loss_func), [&] {
        if (!options.replicate) options.replicate = detail::replicate_of<ModuleHolder>();
        return std::move(options);
      }()) {}

template <typename ModuleHolder>
Learner::Learner(ModuleHolder model, Loss loss_func, LearnerOptions options)
    : Learner(DataLoaders::none(), std::move(model), std::move(loss_func), std::move(options)) {}

template <typename T>
std::shared_ptr<T> Learner::cb() const {
  for (const auto& c : cbs_) {
    if (auto typed = std::dynamic_pointer_cast<T>(c)) return typed;
  }
  return nullptr;
}

}  // namespace fastlearn
