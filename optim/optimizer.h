#pragma once
// Optimizers in fastai's shape: parameter groups, each with its own hyper-parameters ("lr", "mom",
// "sqr_mom", "eps", "wd") that are read at every step, so a scheduler can change them between steps.
// The algorithms derive from Optimizer and implement step_group: optim/sgd.h (momentum, nesterov) and
// optim/adam.h (Adam / AdamW), with weight decay either decoupled (fastai's true weight decay,
// p *= 1 - lr*wd before the update) or as L2 (grad += wd*p, like torch.optim's weight_decay).
#include <fastlearn/core/named_tensors.h>
#include <fastlearn/core/safetensors.h>

#include <ATen/core/Tensor.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace fastlearn {

using Hypers = std::map<std::string, double>;

/// The elements of one parameter that this process updates when data parallel training shards the optimizer
/// (DistributedTrainerOptions::shard): [begin, begin + numel) of its elements in memory order (the order of its
/// gradient in a bucket); numel 0 when another process updates all of it.
struct ShardRange {
  std::int64_t begin = 0;
  std::int64_t numel = 0;
  bool operator==(const ShardRange&) const = default;
};

/// What Optimizer::shard needs: per group and parameter, the range this process updates, and how the processes put
/// a parameter's state back together from their pieces.
struct ShardPlan {
  std::vector<std::vector<ShardRange>> ranges;
  /// Collective, called in the same order on every process: `whole` (shaped and laid out like its parameter,
  /// zeros) gets every process's `piece` (its range's elements of one state tensor; undefined for an empty range)
  /// at its range.
  std::function<void(const at::Tensor& whole, const at::Tensor& piece, const ShardRange& range)> gather;
  /// Collective, at the end of every step(): every process's updated pieces into every process's parameters, so
  /// that whatever runs after the step sees whole parameters.
  std::function<void()> gather_params;
  /// Optional, per group and parameter: the 1-d tensor of range.numel elements that holds this process's elements and
  /// that the step updates, where that is not the parameter's own memory (sharded parameters keep their elements
  /// apart from the parameter, whose memory is freed between uses). Empty: views of each parameter's memory.
  std::vector<std::vector<at::Tensor>> pieces;
};

struct ParamGroup {
  std::vector<at::Tensor> params;
  Hypers hypers;
};

class Optimizer {
 public:
  /// Takes the groups as they are; a parameter in two groups, an undefined or non-floating-point
  /// parameter, or no group at all is a ConfigError.
  explicit Optimizer(std::vector<ParamGroup> groups);
  virtual ~Optimizer();
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  /// One update of every parameter that has a gradient (parameters without .grad() are skipped).
  void step();
  /// Drops every gradient (set to undefined, as torch's set_to_none=True), or zeroes in place when
  /// set_to_none is false.
  void zero_grad(bool set_to_none = true);

  /// The groups; hypers may be changed freely, the parameter lists only in place (adding or removing
  /// parameters or groups needs a new optimizer: step() throws a ConfigError).
  std::vector<ParamGroup>& param_groups() { return groups_; }
  const std::vector<ParamGroup>& param_groups() const { return groups_; }
  std::size_t n_groups() const { return groups_.size(); }

  /// The value of hyper-parameter `name` in group `group`; ConfigError naming both if absent.
  double hyper(const std::string& name, std::size_t group) const;
  /// Sets `name` in every group; ConfigError if the groups do not have that hyper-parameter.
  void set_hyper(const std::string& name, double value);
  /// Sets `name` per group: one value for all groups, or one per group; any other size is a ConfigError.
  void set_hyper(const std::string& name, const std::vector<double>& per_group);

  /// Exempts `params` from weight decay, as fastai's per-parameter `do_wd = False`: each step updates them with the
  /// group's hypers but "wd" taken as 0. Parameters this optimizer does not hold are ignored; others keep decaying.
  void exempt_from_weight_decay(const std::vector<at::Tensor>& params);
  /// Whether parameter `index` of group `group` gets the group's weight decay.
  bool decays(std::size_t group, std::size_t index) const;

  // --- sharded stepping (ZeRO stages 1 and 2: data parallel training with DistributedTrainerOptions::shard) ---
  /// From now on step() updates only `plan.ranges` of each parameter, then calls plan.gather_params, keeping state for
  /// those elements only: each
  /// parameter's piece is a 1-d view of its memory (shard_piece), whose .grad is what step() reads (set by whoever
  /// reduced the gradients; a piece with .grad counts as a step of its parameter even when empty, so every process
  /// counts the same steps). Whole state (loaded, or made before) is cut to the pieces here; pieces of an earlier
  /// plan are gathered through the old plan first, one tensor at a time (collective then). ConfigError for an
  /// optimizer that is not elementwise, a parameter that is not dense, ranges that do not fit, or device_hypers.
  void shard(ShardPlan plan);
  /// Back to whole parameters: the state gathered (collective when there is state), the pieces dropped.
  void unshard();
  bool sharded() const { return !plan_.ranges.empty(); }
  const ShardPlan& shard_plan() const { return plan_; }
  /// The piece of parameter `index` of group `group` this process updates (sharded only).
  at::Tensor& shard_piece(std::size_t group, std::size_t index);
  /// Whether step_group's update of an element reads no other element (SGD, Adam): what sharded stepping needs.
  virtual bool elementwise() const { return true; }

  /// Calls of step() so far (restored by load_state).
  std::int64_t step_count() const { return step_count_; }

  // --- device hyper-parameters: what a step captured in a CUDA graph reads (LearnerOptions::cuda_graph) ---
  /// A graph replays its kernels with the arguments they were launched with, so whatever changes between steps
  /// must be in memory the kernels read. With this on, each group's hyper-parameters are also kept in a tensor on
  /// its parameters' device, refreshed from the host values before each step by a copy that does not make the host
  /// wait (stage_hypers), and the step counts live there too, advanced by the step's own kernels; the update then
  /// takes no host value that changes between steps and branches on none. The results equal the host path's to
  /// float rounding. Off by default: launched step by step, the host path's fused kernels are faster.
  void set_device_hypers(bool on);
  bool device_hypers() const { return device_hypers_; }
  /// Copies the host hyper-parameters into their device tensors (nothing without device_hypers). step() does it
  /// itself except while its stream is being captured; whoever replays a captured step calls it before the replay.
  void stage_hypers();
  /// Per group, the indices of the parameters the last step() updated.
  std::vector<std::vector<std::size_t>> last_updated() const;
  /// The host's bookkeeping of a step whose kernels ran without step() (a replay of a captured step): the step counts
  /// of the parameters that step updated (`updated`, as last_updated() gave it after the capture), and step_count().
  void count_replayed_step(const std::vector<std::vector<std::size_t>>& updated);
  /// A parameter that requires a gradient and was never updated ("parameter 3 of group 0"), or empty: its first update
  /// makes its state, so a step that may be its first cannot be captured and replayed.
  std::string never_updated_trainable() const;
  /// The device tensors of device_hypers ("<group>.hypers", "<group>.steps"), for whoever must know whether they
  /// moved; empty without device_hypers or before the first step made them.
  NamedTensors device_hyper_tensors() const;
  /// Appends where every state tensor and device hyper tensor is (their data pointers, in a fixed order): what a
  /// caller replaying a captured step compares to see that none was replaced (a checkpoint loaded, a state made).
  void append_state_addresses(std::vector<const void*>& out) const;

  /// A short name of the algorithm ("SGD", "Adam"), recorded in checkpoints and checked on load.
  virtual std::string type() const = 0;

  /// Checkpointing: every state tensor, named "<group>.<param index in group>.<state name>" (e.g.
  /// "0.3.exp_avg"), for the parameters that have been updated at least once. The tensors are the live
  /// state (not copies): serialize them before the next step(). Sharded, each is whole, gathered from every
  /// process (collective: every process calls it) into a new tensor.
  NamedTensors state_tensors() const;
  /// The rest of the state as a JSON object: {"type": "Adam", "step_count": 12, "groups": [{"hypers":
  /// {"lr": 0.001, ...}, "steps": [12, 12, 0]}, ...]} where "steps" counts the updates of each parameter.
  std::string state_json() const;
  /// state_tensors() one tensor at a time, for a streamed save: each makes its tensor when called (sharded: gathered
  /// from every process, a collective: every process calls them, in order). Valid until the next step().
  std::vector<DeferredTensor> deferred_state_tensors() const;
  /// The state tensors as this process holds them, named as state_tensors() names them: the pieces when sharded
  /// (1-d, this process's elements only), without a collective. For measuring memory, not for checkpoints.
  NamedTensors held_state_tensors() const;
  /// Inverse of state_tensors() + state_json(): restores the hypers, the step counts and a copy of every
  /// state tensor (moved to its parameter's device). A missing or extra tensor, a shape or dtype mismatch,
  /// a different group layout or optimizer type is a CheckpointError that names the culprit; on error the
  /// optimizer is left unchanged. Sharded, whole tensors are given and each process keeps its pieces.
  void load_state(const NamedTensors& tensors, const std::string& json);

  // For the algorithms' constructors and step_group; `algorithm` / `where` name them in the errors.
  /// One group per parameter list, each with `hypers`.
  static std::vector<ParamGroup> make_groups(std::vector<std::vector<at::Tensor>> params, const Hypers& hypers);
  /// ConfigError unless `value` is finite.
  static void check_finite(const std::string& name, double value, const std::string& where);
  /// ConfigError unless lr is finite and >= 0.
  static void validate_lr(double lr, const char* algorithm);
  /// The value of a hyper-parameter inside step_group (ConfigError naming the ones the group has).
  static double read_hyper(const ParamGroup& group, const char* name, const char* algorithm);
  /// ConfigError, before anything changes, unless the active parameters' gradients are dense and shaped like them.
  static void check_grads(const ParamGroup& group, const std::vector<std::size_t>& active, const char* algorithm);
  /// Whether two tensors lay out the same elements at the same offsets.
  static bool same_layout(const at::Tensor& a, const at::Tensor& b);
  /// Whether ATen's fused kernels can update `p` from its gradient `g` (same dense layout, floating): on the CPU,
  /// and with `cuda_too` on a CUDA device as well (a non-empty tensor, listed with others of its device and dtype).
  static bool fusable(const at::Tensor& p, const at::Tensor& g, bool cuda_too = false);
  /// What a fused list gets for a fusable tensor: on the CPU, a 1-d view of a dense tensor's memory in memory order
  /// (the tensor itself when contiguous). ATen's CPU kernels copy a gradient that is not contiguous (channels-last)
  /// before they walk raw memory, and then do not use the copy; a view in memory order is contiguous, so the
  /// update is the same, element for element, without that copy.
  static at::Tensor fused_operand(const at::Tensor& t);

 protected:
  /// The per-parameter state of one group.
  struct GroupState {
    /// Updates each parameter received, the one in progress included.
    std::vector<std::int64_t> steps;
    /// State name -> one tensor per parameter (undefined before the parameter's first update).
    std::map<std::string, std::vector<at::Tensor>> tensors;
    /// `steps` as a float32 CPU tensor, for the fused kernels, which read step counts from tensors.
    at::Tensor step_tensor;
    /// 0-dim views of step_tensor, one per parameter.
    std::vector<at::Tensor> step_views;
    /// This step's copies of step_tensor on the GPUs that asked for them (step_views_on), as 0-dim views.
    std::vector<std::pair<c10::Device, std::vector<at::Tensor>>> device_step_views;

    // device_hypers only (made at the first step with it on, on the group's device):
    /// The group's hyper-parameters in the order of `hyper_names`, then a 0 ("wd" of the exempt parameters), float64.
    at::Tensor hypers_on_device;
    std::vector<std::string> hyper_names;
    std::vector<at::Tensor> hyper_views;  ///< 0-dim views of hypers_on_device
    /// The step counts there (float32, as `step_tensor`), counted by the step's kernels, and their 0-dim views.
    at::Tensor steps_on_device;
    std::vector<at::Tensor> device_steps;
    /// The parameters the last step() updated (count_replayed_step counts them again).
    std::vector<std::size_t> last_active;
    /// Set while step_group updates the parameters exempt from weight decay: hyper_on_device gives 0 for "wd".
    bool exempt_pass = false;
  };

  /// Whether step_group is to read the hyper-parameters from the device (device_hypers is on).
  bool reads_device_hypers() const { return device_hypers_; }
  /// Hyper-parameter `name` of the group as a 0-dim float64 tensor on its device (device_hypers only).
  static const at::Tensor& hyper_on_device(const GroupState& state, const char* name, const char* algorithm);

  /// `state`'s step counts where a fused kernel on `device` reads them: step_views on the CPU; on a GPU, views of
  /// a copy made once per step through pinned memory, so that the host never waits for the GPU.
  static const std::vector<at::Tensor>& step_views_on(GroupState& state, const c10::Device& device);

  /// Subclasses update the params of `group` listed in `active` (those with a gradient), whose step
  /// counts in `state.steps` already include this update. Runs under a NoGradGuard.
  virtual void step_group(ParamGroup& group, GroupState& state, const std::vector<std::size_t>& active) = 0;
  /// Puts each state tensor of the `active` parameters on its parameter's device and lays it out like its parameter,
  /// where either differs (values kept).
  static void follow_params(const std::vector<at::Tensor>& params, GroupState& state,
                            const std::vector<std::size_t>& active);
  /// Names of the per-parameter state tensors the algorithm keeps, each shaped like its parameter.
  virtual std::vector<std::string> state_names() const = 0;

 private:
  /// step_group for the active parameters of group `g`, the ones exempt from weight decay in a call of their own.
  void step_group_with_exemptions(std::size_t g, const std::vector<std::size_t>& active);

  /// The group step_group updates: the parameters themselves, or their pieces when sharded.
  ParamGroup stepped_group(std::size_t g) const;
  /// The whole state tensor `name` of parameter i of group g from the pieces (sharded; collective).
  at::Tensor whole_state(std::size_t g, std::size_t i, const at::Tensor& piece) const;

  std::vector<ParamGroup> groups_;
  std::vector<GroupState> states_;
  ShardPlan plan_;
  std::vector<std::vector<at::Tensor>> pieces_;  ///< sharded: per group and parameter, its piece
  std::vector<std::vector<bool>> exempt_;        ///< per group and parameter: no weight decay
  std::int64_t step_count_ = 0;
  bool device_hypers_ = false;
  /// Makes (or remakes, when the device moved) a group's device tensors from the host's values.
  void make_device_state(std::size_t g);
  /// Copies group `g`'s host hyper-parameters into its device tensor.
  void stage_group(std::size_t g);
};

using OptFunc = std::function<std::unique_ptr<Optimizer>(std::vector<std::vector<at::Tensor>> param_groups, double lr)>;

}  // namespace fastlearn
