// The fastlearn command line.
#include <fastlearn/core/build_info.h>
#include <fastlearn/core/error.h>
#include <fastlearn/core/suggest.h>
#include <fastlearn/distributed/launcher.h>

#include "cli/run.h"

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

struct LaunchArgs {
  fastlearn::LaunchOptions options;
  std::optional<std::vector<std::string>>
      after_dashes;  // after the first "--": kept from CLI11, which would read them as its options
  std::string log_dir;
  double grace_seconds = 10;
  bool no_prefix = false;
  bool standalone = false;
  bool no_python = false;
};

// Every option name of `cmd` ("--nproc-per-node", "--nproc_per_node", ...).
std::vector<std::string> option_names(const CLI::App& cmd) {
  std::vector<std::string> names;
  for (const auto* opt : cmd.get_options()) {
    for (const auto& n : opt->get_lnames()) names.push_back("--" + n);
  }
  return names;
}

// torchrun options fastlearn launch has no counterpart for, with what to do instead.
std::string torchrun_only(std::string_view flag) {
  std::string name(flag.substr(0, flag.find('=')));
  std::replace(name.begin(), name.end(), '_', '-');
  if (name == "--rdzv-backend" || name == "--rdzv-endpoint" || name == "--rdzv-conf" || name == "--local-addr")
    return "fastlearn launch meets the other nodes through --master-addr / --master-port (a static rendezvous)";
  if (name == "--module" || name == "-m" || name == "--run-path")
    return "fastlearn launch runs a program, not a Python module: put the command after --";
  if (name == "--redirects" || name == "--tee" || name == "--logs-specs")
    return "every rank's output is shown prefixed with its rank; --log-dir also writes it to files";
  if (name == "--monitor-interval" || name == "--start-method" || name == "--role")
    return "fastlearn launch has no such setting (it watches its ranks through pidfds)";
  return "";
}

// `fastlearn launch [options] -- program args...`: torchrun for any program.
CLI::App* add_launch(CLI::App& app, LaunchArgs& a) {
  auto* launch = app.add_subcommand(
      "launch",
      "Run a program on N processes of this node with torchrun's environment (RANK, WORLD_SIZE, LOCAL_RANK, "
      "MASTER_ADDR, MASTER_PORT, ...), output prefixed with the rank; when one rank fails the others are stopped. "
      "Put the program after `--`: fastlearn launch --nproc-per-node 2 -- ./train --epochs 3");
  launch->footer(
      "Exit code: 0 when every rank exited with 0; else the first failing rank's exit code (128 + signal when a "
      "signal killed it), of the last attempt with --max-restarts; 128 + signal when SIGINT/SIGTERM stopped the run.");
  auto& o = a.options;
  launch->add_option("--nproc-per-node,--nproc_per_node", o.nproc_per_node, "Processes (ranks) to start on this node")
      ->check(CLI::Range(1, 4096))
      ->capture_default_str();
  launch->add_option("--nnodes", o.nnodes, "Nodes in the job; run one `fastlearn launch` per node")
      ->check(CLI::Range(1, 65536))
      ->capture_default_str();
  launch
      ->add_option("--node-rank,--node_rank", o.node_rank,
                   "This node's index in [0, nnodes): global rank = node_rank * "
                   "nproc_per_node + local rank")
      ->check(CLI::Range(0, 65535))
      ->capture_default_str();
  launch
      ->add_option("--master-addr,--master_addr", o.master_addr,
                   "Address of the node that runs rank 0 (the rendezvous store "
                   "binds there; it has no authentication)")
      ->capture_default_str();
  launch
      ->add_option("--master-port,--master_port", o.master_port,
                   "Port of the rendezvous store; 0 picks a free one (one node "
                   "only: several nodes need the same explicit port)")
      ->check(CLI::Range(0, 65535))
      ->capture_default_str();
  launch
      ->add_option("--max-restarts,--max_restarts", o.max_restarts,
                   "Restart all ranks of this node up to this many times after "
                   "a failure (TORCHELASTIC_RESTART_COUNT tells which attempt)")
      ->check(CLI::Range(0, 1000))
      ->capture_default_str();
  launch->add_option("--log-dir,--log_dir", a.log_dir,
                     "Also write each rank's output to DIR/rank<R>.log (DIR/restart_<k>/ "
                     "after restarts)");
  launch
      ->add_option("--grace-period,--grace_period", a.grace_seconds,
                   "Seconds between SIGTERM and SIGKILL when stopping ranks")
      ->check(CLI::Range(0.0, 86400.0))
      ->capture_default_str();
  launch->add_flag("--no-prefix,--no_prefix", a.no_prefix,
                   "Do not put \"[rank R] \" before each line of the ranks' output");
  // torchrun's spellings: each option above also takes its underscore form (--nproc_per_node), and these:
  launch->add_option("--rdzv-id,--rdzv_id,--run-id,--run_id", o.run_id,
                     "The job's id: every node of a job must get the same (default: random on one node)");
  launch->add_flag("--standalone", a.standalone, "One node with a local rendezvous on a free port (as torchrun's)");
  launch->add_flag("--no-python,--no_python", a.no_python,
                   "Accepted for torchrun's sake: fastlearn launch runs the program itself, never through python");
  // Without `--`, everything from the first argument that is not one of the options above is the command.
  launch->prefix_command();
  return launch;
}

int run_launch(CLI::App& launch, LaunchArgs& a) {
  auto& o = a.options;
  o.command = launch.remaining();
  // An option this launcher does not know ends up at the head of the command (prefix_command): name it.
  if (!o.command.empty() && o.command.front().starts_with("-")) {
    const auto& flag = o.command.front();
    const auto why = torchrun_only(flag);
    throw fastlearn::ConfigError(fmt::format(
        "launch: unknown option '{}'{}; the nearest option of fastlearn launch is {} (fastlearn launch --help lists "
        "them). Put the program after `--`",
        flag, why.empty() ? "" : " (a torchrun option: " + why + ")",
        fastlearn::closest(flag.substr(0, flag.find('=')), option_names(launch))));
  }
  if (a.standalone) {
    if (o.nnodes != 1) throw fastlearn::ConfigError("launch: --standalone is one node; it cannot go with --nnodes > 1");
    o.master_addr = "127.0.0.1";
    o.master_port = 0;
  }
  if (a.after_dashes) {
    // `launch prog x -- y`: the `--` belongs to prog's arguments.
    if (!o.command.empty()) o.command.emplace_back("--");
    o.command.insert(o.command.end(), a.after_dashes->begin(), a.after_dashes->end());
  }
  if (o.command.empty())
    throw fastlearn::ConfigError("launch: no program given; put it after `--`: fastlearn launch -- ./train args...");
  if (!a.log_dir.empty()) o.log_dir = a.log_dir;
  o.grace_period = std::chrono::milliseconds(static_cast<long long>(a.grace_seconds * 1000.0));
  o.prefix_output = !a.no_prefix;
  const auto result = fastlearn::launch(o);
  if (result.exit_code != 0) std::cerr << "fastlearn launch: " << result.summary << "\n";
  return result.exit_code;
}

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
         fastlearn::cli::describe_keys();
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

CLI::App* add_predict(CLI::App& app, fastlearn::cli::TrainArgs& a, std::string& checkpoint,
                      std::vector<std::string>& inputs) {
  auto* cmd = app.add_subcommand(
      "predict",
      "Load a checkpoint's weights into CONFIG's model and print, for each input, its class and probability "
      "(multi-label: every class at or above 0.5; a table's model: its prediction for each row)");
  add_config_options(*cmd, a);
  add_checkpoint_option(*cmd, checkpoint);
  cmd->add_option("inputs", inputs,
                  "Image files (JPEG or PNG) or folders of them (every image under the folder), or for a table's "
                  "config CSV files of rows")
      ->required();
  return cmd;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"fastlearn: fastai-style training over LibTorch, on one process or many"};
  app.set_version_flag(
      "-V,--version", [] { return fastlearn::describe(fastlearn::build_info()); },
      "Print the fastlearn and LibTorch versions and whether CUDA, NCCL and Gloo are compiled in");
  LaunchArgs launch_args;
  auto* launch = add_launch(app, launch_args);
  fastlearn::cli::TrainArgs train_args, lr_find_args, validate_args, interpret_args, predict_args;
  std::string checkpoint;
  int top = 16;
  std::vector<std::string> predict_inputs;
  auto* train = add_train(app, train_args);
  auto* lr_find = add_lr_find(app, lr_find_args);
  auto* validate = add_validate(app, validate_args, checkpoint);
  auto* interpret = add_interpret(app, interpret_args, checkpoint, top);
  auto* predict = add_predict(app, predict_args, checkpoint, predict_inputs);
  int parsed_argc = argc;
  for (int i = 1; i < argc; ++i) {
    if (std::string_view(argv[i]) != "--") continue;
    launch_args.after_dashes = std::vector<std::string>(argv + i + 1, argv + argc);
    parsed_argc = i;
    break;
  }
  try {
    app.parse(parsed_argc, argv);
    if (launch->parsed()) return run_launch(*launch, launch_args);
    if (train->parsed()) return fastlearn::cli::run_train(train_args);
    if (lr_find->parsed()) return fastlearn::cli::run_lr_find(lr_find_args);
    if (validate->parsed()) return fastlearn::cli::run_validate(validate_args, checkpoint);
    if (interpret->parsed()) return fastlearn::cli::run_interpret(interpret_args, checkpoint, top);
    if (predict->parsed()) return fastlearn::cli::run_predict(predict_args, checkpoint, predict_inputs);
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
