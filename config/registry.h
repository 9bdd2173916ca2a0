#pragma once
// The names a training config may give, each with what it fits and what builds it: the losses and metrics
// (by task), the architectures (by dataset), the optimizers and the schedules. One table per kind, read by
// the config's checks (an unknown name is an error that lists the names that fit) and by learner_from_config
// (which builds from the entry it finds). fastlearn's own entries come first, in the order in which the
// first that fits is the default; an app may add its own before it reads a config.
#include <fastlearn/config/train_config.h>
#include <fastlearn/learner/learner.h>
#include <fastlearn/learner/loss.h>
#include <fastlearn/learner/metrics.h>
#include <fastlearn/optim/optimizer.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace fastlearn {

/// A model and the function that runs it on a batch's inputs, as Learner takes them.
struct BuiltModel {
  std::shared_ptr<torch::nn::Module> module;
  ForwardOutputs forward;
  /// How to copy the model for several devices of one process (LearnerOptions::replicate; empty: none).
  Replicate replicate;
  /// Its parameter groups for fine_tune's freezing and discriminative learning rates (LearnerOptions::splitter; empty:
  /// one group). An arch with a pretrained body and a new head sets models::body_head_split, as vision_learner does.
  Splitter splitter;
  /// Any torch::nn module holder whose forward takes one Tensor, two Tensors, or a vector of them (copied by its
  /// clone()).
  template <class ModuleHolder>
  static BuiltModel of(ModuleHolder model) {
    return {model.ptr(), detail::forward_of(model), detail::replicate_of<ModuleHolder>(), {}};
  }
};

/// train.loss: `tasks` are those it fits (empty: every task).
struct LossChoice {
  std::string name;
  std::vector<Task> tasks;
  std::function<Loss(const TrainConfig&)> make;
};

/// One of train.metrics: `tasks` are those it fits (empty: every task).
struct MetricChoice {
  std::string name;
  std::vector<Task> tasks;
  std::function<MetricPtr(const TrainConfig&)> make;
};

/// train.optimizer; it fits every task.
struct OptimizerChoice {
  std::string name;
  std::function<OptFunc(const TrainConfig&)> make;
};

/// model.arch: `datasets` are the data.dataset values whose items it reads; `make` gets the config and the
/// data (dls.c() outputs). `channels_last`: what train.channels_last = "auto" does for it (convolutions gain from
/// NHWC; a model without them does not).
struct ArchChoice {
  std::string name;
  std::vector<std::string> datasets;
  std::function<BuiltModel(const TrainConfig&, const DataLoaders&)> make;
  bool channels_last = false;
  /// Whether the model `make` builds for the config holds BatchNorm layers (empty: never), so that the config's
  /// check refuses what BatchNorm cannot do (distributed.sync_bn on replicas sharing one GPU) before the data is read.
  std::function<bool(const TrainConfig&)> holds_batch_norm;
};

/// train.schedule: `fit` trains the Learner for train.epochs at train.lr with `options` (callbacks, resume).
struct ScheduleChoice {
  std::string name;
  std::function<void(Learner&, const TrainConfig&, const FitOptions&)> fit;
};

/// Every entry of a kind, fastlearn's first, then those added, in order.
std::vector<LossChoice> loss_choices();
std::vector<MetricChoice> metric_choices();
std::vector<OptimizerChoice> optimizer_choices();
std::vector<ArchChoice> arch_choices();
std::vector<ScheduleChoice> schedule_choices();

/// Adds an entry that configs can then name. ConfigError when the name is taken, is not lowercase letters,
/// digits and '_', has no factory, or (archs) names no dataset or an unknown one. Add before configs are read:
/// a config read earlier has had its names checked against the entries of then.
void add_choice(LossChoice choice);
void add_choice(MetricChoice choice);
void add_choice(OptimizerChoice choice);
void add_choice(ArchChoice choice);
void add_choice(ScheduleChoice choice);

/// The names of the entries that fit `config`, in order; the first is the default. Losses and metrics fit its
/// task, archs its data.dataset; every optimizer and schedule fits.
std::vector<std::string> loss_names(const TrainConfig& config);
std::vector<std::string> metric_names(const TrainConfig& config);
std::vector<std::string> arch_names(const TrainConfig& config);
std::vector<std::string> optimizer_names();
std::vector<std::string> schedule_names();

/// The entry that train.loss (train.optimizer, model.arch, train.schedule) names, or the metric `name`, among
/// those that fit `config`; a ConfigError naming the key and the names that fit when there is none.
LossChoice find_loss(const TrainConfig& config);
MetricChoice find_metric(const std::string& name, const TrainConfig& config);
OptimizerChoice find_optimizer(const TrainConfig& config);
ArchChoice find_arch(const TrainConfig& config);
ScheduleChoice find_schedule(const TrainConfig& config);

}  // namespace fastlearn
