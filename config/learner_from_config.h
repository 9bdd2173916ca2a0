#pragma once
// A Learner from a TrainConfig: the data, model, loss, metrics, optimizer and callbacks the config names (from
// config/registry.h), on the device it names, trained by the schedule it names. What `fastlearn train` runs, and
// what an app builds from a TOML file:
//
//   auto config = fl::load_config("run.toml");
//   auto learn = fl::learner_from_config(config);
//   fl::fit_from_config(*learn, config);
#include <fastlearn/comm/runtime.h>
#include <fastlearn/config/train_config.h>
#include <fastlearn/distributed/distributed_trainer.h>
#include <fastlearn/distributed/parallel_trainer.h>
#include <fastlearn/learner/learner.h>
#include <fastlearn/learner/step_session.h>

#include <filesystem>
#include <memory>
#include <string>

namespace fastlearn {

struct LearnerFromConfigOptions {
  /// The run's folder (the Learner's path: checkpoints/, history.csv, ...). Empty: output.dir.
  std::filesystem::path out;
  /// The callbacks of a training run that [callbacks] and [output] ask for: metrics.json, history.csv, early
  /// stopping, the best model, TensorBoard, checkpoints, and a graceful stop on SIGINT / SIGTERM. Off for a
  /// Learner that only evaluates or predicts.
  bool run_callbacks = true;
  /// The Progress callback: bars on a TTY, a line per epoch otherwise.
  bool progress = true;
  /// The config is what load_config / parse_config returned (perhaps with output.dir changed): it is not checked
  /// again. Otherwise (a config built in code) check_config checks it as a value, as a file holding it would be.
  bool checked = false;
};

/// The Learner of `config`, after seeding with train.seed (the initial weights and the data order follow it). The
/// config is checked as a file holding it would be (unless options.checked: an unknown name or a value out of range
/// is a ConfigError), and against the data: train.top_k at most the number of classes.
std::unique_ptr<Learner> learner_from_config(const TrainConfig& config, const LearnerFromConfigOptions& options = {});

/// Trains `learn` as train.schedule says, for train.epochs at train.lr (train.pct_start), with `options` (callbacks
/// for this fit, a checkpoint to resume from). ConfigError for data.dataset = "program", whose samples a running
/// program hands over (step_plan).
void fit_from_config(Learner& learn, const TrainConfig& config, const FitOptions& options = {});

/// The steps of a config with data.dataset = "program" (the samples come from a running program, which hands them to
/// Learner::train_step): train.epochs epochs of data.steps_per_epoch steps, data.held_out samples held out for
/// validation, data.valid_bs (0: twice data.bs) their batch size. ConfigError for another dataset.
StepPlan step_plan(const TrainConfig& config);
/// The fit of those steps: train.schedule at train.lr, with `options` (a checkpoint to resume from). Together:
///
///   auto learn = fl::learner_from_config(config);
///   learn->begin_steps(fl::step_plan(config), fl::step_fit(config));
StepFit step_fit(const TrainConfig& config, const FitOptions& options = {});

/// distributed.backend and distributed.timeout_seconds, for DistribCtx / setup_distrib.
SetupOptions setup_options(const DistributedConfig& config);
/// distributed.sync_bn and the gradient buckets, for DistribCtx.
DistributedTrainerOptions trainer_options(const DistributedConfig& config);

/// distributed.devices as devices for ParallelCtx / to_parallel (empty: one device; "cuda": every visible GPU).
std::vector<c10::Device> parallel_devices(const DistributedConfig& config);
/// distributed.sync_bn, the gradient buckets and the timeout, for ParallelCtx.
ParallelTrainerOptions parallel_options(const DistributedConfig& config);

/// train.device, distributed.backend and distributed.devices against this host's GPUs, for `local_ranks` ranks on it: a
/// ConfigError that names `origin` (the config's file), the counts and the ways out, before anything is launched,
/// loaded or written.
void check_devices(const TrainConfig& config, int local_ranks, const std::string& origin);

}  // namespace fastlearn
