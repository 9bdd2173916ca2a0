#include "cli/launch_command.h"

#include <fastlearn/core/detail/suggest.h>
#include <fastlearn/core/detail/text.h>
#include <fastlearn/core/error.h>

#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <iostream>
#include <string>
#include <string_view>
#include <vector>

namespace fastlearn::cli {

namespace {

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

}  // namespace

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

int run_launch(CLI::App& launch, LaunchArgs& a, const LaunchFunction& launch_function) {
  auto& o = a.options;
  o.command = launch.remaining();
  // An option this launcher does not know ends up at the head of the command (prefix_command): name it.
  if (!o.command.empty() && o.command.front().starts_with("-")) {
    const auto& flag = o.command.front();
    const auto why = torchrun_only(flag);
    throw ConfigError(fmt::format(
        "launch: unknown option '{}'{}; the nearest option of fastlearn launch is {} (fastlearn launch --help lists "
        "them). Put the program after `--`",
        excerpt(flag), why.empty() ? "" : " (a torchrun option: " + why + ")",
        closest(flag.substr(0, flag.find('=')), option_names(launch))));
  }
  if (a.standalone) {
    if (o.nnodes != 1) throw ConfigError("launch: --standalone is one node; it cannot go with --nnodes > 1");
    o.master_addr = "127.0.0.1";
    o.master_port = 0;
  }
  if (a.after_dashes) {
    // `launch prog x -- y`: the `--` belongs to prog's arguments.
    if (!o.command.empty()) o.command.emplace_back("--");
    o.command.insert(o.command.end(), a.after_dashes->begin(), a.after_dashes->end());
  }
  if (o.command.empty())
    throw ConfigError("launch: no program given; put it after `--`: fastlearn launch -- ./train args...");
  if (!a.log_dir.empty()) o.log_dir = a.log_dir;
  o.grace_period = std::chrono::milliseconds(static_cast<long long>(a.grace_seconds * 1000.0));
  o.prefix_output = !a.no_prefix;
  const auto result = launch_function(o);
  if (result.exit_code != 0) std::cerr << "fastlearn launch: " << result.summary << "\n";
  return result.exit_code;
}

int split_at_dashes(int argc, char** argv, LaunchArgs& a) {
  for (int i = 1; i < argc; ++i) {
    if (std::string_view(argv[i]) != "--") continue;
    a.after_dashes = std::vector<std::string>(argv + i + 1, argv + argc);
    return i;
  }
  return argc;
}

}  // namespace fastlearn::cli
