// fastlearn-torch: the part of the fastlearn command line that needs LibTorch (train, lr-find, validate, interpret,
// predict, export, --version). `fastlearn` runs it for every subcommand but launch, which it runs itself
// (apps/fastlearn.cpp); run directly, it runs launch too, with the rendezvous store in this process.
#include <fastlearn/config/train_config.h>
#include <fastlearn/core/build_info.h>
#include <fastlearn/core/error.h>
#include <fastlearn/launch/launcher.h>

#include "cli/commands.h"
#include "cli/launch_command.h"

#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <iostream>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace {

// The options train, lr-find, validate, interpret and predict share: the config and its overrides.
void add_config_options(CLI::App& cmd, fastlearn::cli::TrainArgs& a) {
  cmd.add_option("config", a.config_path, "The run's TOML configuration (see configs/ and README.md)")
      ->required()
      ->check(CLI::ExistingFile);
  cmd.add_option("--set", a.sets,
                 "Override one key of the config: --set train.epochs=5 --set model.arch=resnet. The value is read "
                 "as TOML (5, 3e-3, true, [64, 32], \"text\"), anything else as a string; repeatable")
      ->allow_extra_args(false);
}

std::string config_keys_footer() {
  return "Config keys (a wrong name, type or range is an error that says where and what is expected):\n  " +
         fastlearn::describe_config_keys();
}

CLI::App* add_train(CLI::App& app, fastlearn::cli::TrainArgs& a) {
  auto* train = app.add_subcommand(
      "train",
      "Train as CONFIG says and write the run into the output directory: config.toml (the resolved config), "
      "metrics.json, history.csv, checkpoints/ (ckpt-e<epoch>-b<batch>.safetensors after every epoch, and every N "
      "batches with output.checkpoint_every_n_batches; model.safetensors at the end), loss.svg. "
      "Nothing is written before the config is valid.");
  add_config_options(*train, a);
  train->add_option("--out", a.out, "Output directory (default: output.dir of the config)");
  train->add_flag(
      "--resume", a.resume,
      "Continue from the newest complete checkpoints/ckpt-e<epoch>-b<batch>.safetensors in the output directory, "
      "also mid-epoch (from scratch if none)");
  train
      ->add_option("--nproc-per-node", a.nproc_per_node,
                   "Train data parallel on N local processes, started through `fastlearn launch`; ignored when this "
                   "process was started by a launcher (fastlearn launch, torchrun: RANK is set)")
      ->check(CLI::Range(1, 4096));
  train
      ->add_option("--max-restarts", a.max_restarts,
                   "Restart the ranks up to R times after a failure; a restart resumes from the last checkpoint")
      ->check(CLI::Range(0, 1000));
  train->footer(config_keys_footer());
  return train;
}

CLI::App* add_lr_find(CLI::App& app, fastlearn::cli::TrainArgs& a) {
  auto* cmd = app.add_subcommand(
      "lr-find",
      "The learning-rate range test on CONFIG's data and model (one process): writes lr_find.svg into the output "
      "directory and prints the learning rates fastai's four rules suggest (minimum, steep, slide, valley)");
  add_config_options(*cmd, a);
  cmd->add_option("--out", a.out, "Where lr_find.svg goes (default: output.dir of the config)");
  return cmd;
}

void add_checkpoint_option(CLI::App& cmd, std::string& checkpoint) {
  cmd.add_option("--checkpoint", checkpoint, "A .safetensors checkpoint written by `fastlearn train`")
      ->required()
      ->check(CLI::ExistingFile);
}

CLI::App* add_validate(CLI::App& app, fastlearn::cli::TrainArgs& a, std::string& checkpoint) {
  auto* cmd = app.add_subcommand(
      "validate",
      "Load a checkpoint's weights into CONFIG's model and print the loss and metrics on the validation set "
      "(Fashion-MNIST: the 10,000 test images)");
  add_config_options(*cmd, a);
  add_checkpoint_option(*cmd, checkpoint);
  return cmd;
}

CLI::App* add_interpret(CLI::App& app, fastlearn::cli::TrainArgs& a, std::string& checkpoint, int& top) {
  auto* cmd = app.add_subcommand(
      "interpret",
      "Where a classifier goes wrong: load a checkpoint's weights into CONFIG's model, print the confusion matrix "
      "and the most confused classes on the validation set, and write confusion_matrix.csv and top_losses.svg "
      "(the items with the highest loss, each image with its predicted and actual class) into the output directory");
  add_config_options(*cmd, a);
  add_checkpoint_option(*cmd, checkpoint);
  cmd->add_option("--out", a.out, "Where the files go (default: output.dir of the config)");
  cmd->add_option("--top", top, "Items in top_losses.svg")->check(CLI::Range(1, 1000))->capture_default_str();
  return cmd;
}

CLI::App* add_export(CLI::App& app, fastlearn::cli::TrainArgs& a, std::string& checkpoint) {
  auto* cmd = app.add_subcommand(
      "export",
      "Load a checkpoint's weights into CONFIG's model and write export.safetensors into the output directory: the "
      "model with what predicting needs (its recipe, classes or targets, the image pipeline or the table's procs), "
      "for `fastlearn predict EXPORT` and load_learner, without the config or the training data");
  add_config_options(*cmd, a);
  add_checkpoint_option(*cmd, checkpoint);
  cmd->add_option("--out", a.out, "Where export.safetensors goes (default: output.dir of the config)");
  return cmd;
}

// Two forms: `predict EXPORT INPUT...` (an export alone) and the older `predict CONFIG --checkpoint FILE INPUT...`.
CLI::App* add_predict(CLI::App& app, fastlearn::cli::TrainArgs& a, std::string& checkpoint,
                      std::vector<std::string>& inputs, int& workers) {
  auto* cmd = app.add_subcommand(
      "predict",
      "Print, for each input, its class and probability (multi-label: every class at or above the threshold, 0.5; "
      "a regression: each target's value). `predict EXPORT INPUT...` reads an export.safetensors alone (no config, "
      "no training data) and predicts in batches; `predict CONFIG --checkpoint FILE INPUT...` loads a checkpoint's "
      "weights into CONFIG's model");
  cmd->add_option("model", a.config_path,
                  "An export.safetensors (written by `fastlearn train` or `fastlearn export`), or with --checkpoint "
                  "the run's TOML configuration")
      ->required()
      ->check(CLI::ExistingFile);
  cmd->add_option("--set", a.sets, "With a CONFIG: override one of its keys, as for train; repeatable")
      ->allow_extra_args(false);
  cmd->add_option("--checkpoint", checkpoint,
                  "A .safetensors checkpoint written by `fastlearn train`, whose weights go into CONFIG's model")
      ->check(CLI::ExistingFile);
  cmd->add_option("--out", a.out, "With an EXPORT: also write predictions.csv (input, prediction, every output) there");
  cmd->add_option("--workers", workers, "With an EXPORT: threads decoding the images")
      ->check(CLI::Range(0, 256))
      ->capture_default_str();
  cmd->add_option("inputs", inputs,
                  "Image files (JPEG or PNG) or folders of them (every image under the folder), for a table's "
                  "model CSV files of rows, for a program's model .npy or .safetensors files of arrays (with --out)")
      ->required();
  return cmd;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"fastlearn: fastai-style training over LibTorch, on one process or many"};
  app.set_version_flag(
      "-V,--version", [] { return fastlearn::describe(fastlearn::build_info()); },
      "Print the fastlearn and LibTorch versions and whether CUDA, NCCL and Gloo are compiled in");
  fastlearn::cli::LaunchArgs launch_args;
  auto* launch = fastlearn::cli::add_launch(app, launch_args);
  fastlearn::cli::TrainArgs train_args, lr_find_args, validate_args, interpret_args, predict_args;
  std::string checkpoint;
  int top = 16;
  std::vector<std::string> predict_inputs;
  int predict_workers = 2;
  fastlearn::cli::TrainArgs export_args;
  auto* train = add_train(app, train_args);
  auto* lr_find = add_lr_find(app, lr_find_args);
  auto* validate = add_validate(app, validate_args, checkpoint);
  auto* interpret = add_interpret(app, interpret_args, checkpoint, top);
  auto* predict = add_predict(app, predict_args, checkpoint, predict_inputs, predict_workers);
  auto* export_cmd = add_export(app, export_args, checkpoint);
  const int parsed_argc = fastlearn::cli::split_at_dashes(argc, argv, launch_args);
  try {
    app.parse(parsed_argc, argv);
    if (launch->parsed()) return fastlearn::cli::run_launch(*launch, launch_args, fastlearn::launch);
    if (train->parsed()) return fastlearn::cli::run_train(train_args);
    if (lr_find->parsed()) return fastlearn::cli::run_lr_find(lr_find_args);
    if (validate->parsed()) return fastlearn::cli::run_validate(validate_args, checkpoint);
    if (interpret->parsed()) return fastlearn::cli::run_interpret(interpret_args, checkpoint, top);
    if (export_cmd->parsed()) return fastlearn::cli::run_export(export_args, checkpoint);
    if (predict->parsed()) {
      if (!checkpoint.empty()) {
        if (!predict_args.out.empty())
          throw fastlearn::ConfigError("predict: --out goes with an EXPORT; with CONFIG --checkpoint, redirect stdout");
        return fastlearn::cli::run_predict(predict_args, checkpoint, predict_inputs);
      }
      if (!predict_args.sets.empty())
        throw fastlearn::ConfigError("predict: --set changes a CONFIG's keys; an EXPORT has none to change");
      return fastlearn::cli::run_predict_export(predict_args.config_path, predict_inputs, predict_args.out,
                                                predict_workers);
    }
    if (launch_args.after_dashes)
      throw fastlearn::ConfigError(
          "arguments after `--` need a subcommand: fastlearn launch [options] -- program args...");
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const fastlearn::Error& e) {
    std::cerr << "fastlearn: error: " << e.what() << "\n";
    return 1;
  } catch (const std::exception& e) {  // e.g. a torch error while training
    std::cerr << "fastlearn: error: " << e.what() << "\n";
    return 1;
  }
  std::cout << app.help();
  return 0;
}
