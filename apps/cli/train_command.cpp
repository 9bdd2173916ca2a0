// `fastlearn train` and `fastlearn lr-find`: a config's Learner trained into a run folder (on this process, or on
// N local ranks through the launcher), or its learning-rate range test.
#include "cli/command_config.h"
#include "cli/commands.h"
#include "cli/run_folder.h"

#include <fastlearn/callbacks/checkpointing.h>
#include <fastlearn/callbacks/graceful_stop.h>
#include <fastlearn/comm/runtime.h>
#include <fastlearn/config/learner_from_config.h>
#include <fastlearn/core/detail/text.h>
#include <fastlearn/core/device.h>
#include <fastlearn/core/safetensors.h>
#include <fastlearn/data/detail/file_lock.h>
#include <fastlearn/distributed/distrib_ctx.h>
#include <fastlearn/launch/launcher.h>
#include <fastlearn/learner/checkpoint.h>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <optional>
#include <utility>

namespace fastlearn::cli {

namespace fs = std::filesystem;

namespace {

// A restart by the launcher (--max-restarts) continues from the last checkpoint.
bool restarted_by_launcher() {
  const char* count = std::getenv("TORCHELASTIC_RESTART_COUNT");
  return count && std::atoi(count) > 0;
}

// The newest complete checkpoint of the run in `out` to continue from, or nothing (a torn one is skipped
// with a message). Every rank calls it and finds the same file: checkpoints are written before a barrier.
std::optional<fs::path> checkpoint_to_resume(const fs::path& out) {
  const auto dir = out / "checkpoints";
  auto found = latest_checkpoint(dir);
  if (!is_main()) return found;
  if (found)
    fmt::print("resume: continuing from {}\n", excerpt(found->string(), 256));
  else
    fmt::print("resume: no checkpoint in {}; starting from the beginning\n", excerpt(dir.string(), 256));
  std::fflush(stdout);  // before an error the load may print on stderr
  if (!found) return found;
  const auto metadata = load_safetensors_metadata(*found);
  const auto saved = metadata.find("world_size");
  const int ranks = world_size();  // from the environment: 1 outside a launcher
  if (saved != metadata.end() && saved->second != std::to_string(ranks)) {
    fmt::print(stderr,
               "resume: warning: the checkpoint was written by {} rank(s) and this run has {}: training goes on, "
               "but with another global batch and data order than the interrupted run had\n",
               excerpt(saved->second), ranks);
  }
  return found;
}

// Rank 0 holds the output folder's lock (flock on the folder itself) for the whole run, so that a second run into
// the same folder stops at once instead of mixing its files and checkpoints into this one's; the kernel releases
// it when the process ends, however it ends. A folder it had to create is removed again if the run leaves it empty.
class OutputFolderLock {
 public:
  explicit OutputFolderLock(fs::path out) : out_(std::move(out)), created_(fs::create_directories(out_)) {
    lock_ = FileLock::try_lock(out_);
    if (lock_) return;
    remove_if_made_and_empty();
    throw ConfigError(
        fmt::format("--out {}: another fastlearn run is training into this folder; wait for it to end, "
                    "stop it, or choose another --out",
                    excerpt(out_.string(), 256)));
  }
  OutputFolderLock(const OutputFolderLock&) = delete;
  OutputFolderLock& operator=(const OutputFolderLock&) = delete;
  ~OutputFolderLock() {
    lock_.reset();
    remove_if_made_and_empty();
  }

 private:
  void remove_if_made_and_empty() const {
    std::error_code ignored;
    if (created_ && fs::is_empty(out_, ignored)) fs::remove(out_, ignored);
  }
  fs::path out_;
  bool created_;
  std::unique_ptr<FileLock> lock_;
};

// A relative data.path is the working directory's, as for every command-line tool: says which folder that was.
std::string relative_to(const std::string& path) {
  return fs::path(path).is_relative()
             ? fmt::format(" (relative to the working directory {})", excerpt(fs::current_path().string(), 256))
             : std::string();
}

// data.path against what data.dataset reads, before anything is launched or written.
void check_data_path(const TrainConfig& config, const std::string& origin) {
  const auto& d = config.data;
  const bool csv_file = is_tabular(d) || is_ratings(d);
  if (csv_file && !fs::is_regular_file(d.path))
    throw ConfigError(fmt::format("{}: data.path '{}'{} is not a file; point it at the CSV file", excerpt(origin, 256),
                                  excerpt(d.path, 256), relative_to(d.path)));
  if (csv_file || d.path.empty() || fs::is_directory(d.path)) return;
  const char* hint = d.dataset == "image_folder" ? "point it at the folder of class folders (or of train/ and valid/)"
                     : d.dataset == "image_csv"  ? "point it at the folder holding data.csv's table and the images"
                     : d.dataset == "fashion_mnist"
                         ? "point it at an MNIST-format folder, or leave it out to use the default Fashion-MNIST"
                         : "point it at the data's folder";
  throw ConfigError(fmt::format("{}: data.path '{}'{} (data.dataset = \"{}\") is not a folder; {}",
                                excerpt(origin, 256), excerpt(d.path, 256), relative_to(d.path), d.dataset, hint));
}

// `fastlearn train ... --nproc-per-node N`: this same command on N local ranks through the launcher.
int relaunch(const TrainArgs& args, const std::string& out) {
  LaunchOptions options{.nproc_per_node = std::max(args.nproc_per_node, 1), .max_restarts = args.max_restarts};
  options.command = {fs::read_symlink("/proc/self/exe").string(), "train", args.config_path};
  for (const auto& s : args.sets) options.command.insert(options.command.end(), {"--set", s});
  options.command.insert(options.command.end(), {"--out", out});
  if (args.resume) options.command.emplace_back("--resume");
  const auto result = launch(options);
  if (result.exit_code != 0) std::cerr << "fastlearn train: " << result.summary << "\n";
  return result.exit_code;
}

}  // namespace

int run_train(const TrainArgs& args) {
  auto config = read_config_file(args);  // throws before anything is written
  if (config.data.dataset == "program")
    throw ConfigError(fmt::format(
        "{}: data.dataset = \"program\" trains on samples a running program hands over (the step API, or fl_train_step "
        "of the C interface; docs/c_fortran.md); `fastlearn train` has no program to take them from",
        excerpt(args.config_path, 256)));
  const fs::path out = args.out.empty() ? fs::path(config.output.dir) : fs::path(args.out);
  config.output.dir = out.string();
  // The ranks on this host: the launch about to start them, or the job this process is one of.
  check_devices(config, under_launcher() ? local_world_size() : std::max(args.nproc_per_node, 1), args.config_path);
  check_data_path(config, args.config_path);
  if (!under_launcher() && (args.nproc_per_node > 1 || args.max_restarts > 0)) return relaunch(args, out.string());
  if (under_launcher() && (args.nproc_per_node > 1 || args.max_restarts > 0)) {
    // A stale RANK in the shell would otherwise turn the flags off without a word (and wait for ranks never started).
    fmt::print(stderr,
               "fastlearn train: RANK is set ({}), so this process is one rank of a job someone else launched: "
               "--nproc-per-node and --max-restarts are ignored (unset RANK to have train start its own ranks)\n",
               excerpt(std::getenv("RANK")));
  }

  DistribCtx job(setup_options(config.distributed));  // the launched job's group, torn down at exit
  const bool resume = args.resume || restarted_by_launcher();
  std::optional<OutputFolderLock> folder_lock;
  if (is_main()) {
    folder_lock.emplace(out);
    if (put_back_interrupted_takeover(out, /*fresh=*/!resume))
      fmt::print(stderr,
                 "fastlearn train: a run into {} was killed while taking it over; the older run's files are "
                 "back as they were\n",
                 excerpt(out.string(), 256));
  }
  std::unique_ptr<Learner> learn;
  ValidationResult result;
  try {
    learn = learner_from_config(config, {.out = out, .run_callbacks = true, .checked = true});
    DistribCtx ctx(*learn, trainer_options(config.distributed), setup_options(config.distributed));
    std::optional<ParallelCtx> replicas;  // distributed.devices: several devices of this process
    if (!config.distributed.devices.empty())
      replicas.emplace(*learn, parallel_devices(config.distributed), parallel_options(config.distributed));
    if (is_main()) {
      const auto where = describe_device(learn->device());
      if (replicas && replicas->active())
        fmt::print("training on {} devices of this process: {}\n", learn->cb<ParallelTrainer>()->replica_count(),
                   fmt::join(config.distributed.devices.size() == 1 ? std::vector<std::string>{"every GPU"}
                                                                    : config.distributed.devices,
                             ", "));
      else if (world_size() > 1)
        fmt::print("training on {} ranks over {}; rank 0 on {}\n", world_size(), to_string(world_group().kind()),
                   where);
      else
        fmt::print("training on {}\n", where);
      std::fflush(stdout);
    }
    // A fresh run looks for no checkpoint, and only rank 0 writes them: its RunFolder sets the older run's aside.
    fit_from_config(*learn, config,
                    {.cbs = {std::make_shared<RunFolder>(out, to_toml(config), /*fresh=*/!resume)},
                     .resume_from = resume ? checkpoint_to_resume(out).value_or(fs::path()) : fs::path()});
    if (const auto stop = learn->cb<GracefulStop>(); stop && stop->stopped()) {
      const int signal = stop_signal() != 0 ? stop_signal() : SIGTERM;  // 0 here: another rank got it
      if (is_main())
        fmt::print(stderr, "fastlearn train: stopped by signal {}; `--resume` continues from the last checkpoint\n",
                   signal);
      return 128 + signal;
    }
    result = learn->validate();  // on every rank: gathered, exact
    learn->save("model", {.with_opt = false});
    learn->export_to(
        "export.safetensors");  // into `out`, the model alone, for `fastlearn predict EXPORT` and load_learner
  } catch (...) {
    try {
      if (is_main() && put_back_after_failure(out))
        fmt::print(stderr,
                   "fastlearn train: the run failed before it had an epoch or a checkpoint of its own; the older "
                   "run's files in {} are back as they were\n",
                   excerpt(out.string(), 256));
    } catch (const std::exception& e) {  // the run's own error matters more: report this one beside it
      fmt::print(stderr, "fastlearn train: could not put the older run's files in {} back: {}\n",
                 excerpt(out.string(), 256), e.what());
    }
    throw;
  }
  if (!is_main()) return 0;
  if (config.output.plots) learn->recorder().plot_loss(out / "loss.svg");
  fmt::print("final {} set: {}; outputs in {}\n", config.data.dataset == "fashion_mnist" ? "test" : "validation",
             describe(result), excerpt(out.string(), 256));
  return 0;
}

int run_lr_find(const TrainArgs& args) {
  auto config = read_config_file(args);
  const fs::path out = args.out.empty() ? fs::path(config.output.dir) : fs::path(args.out);
  auto learn = learner_from_config(config, {.out = out, .run_callbacks = false, .checked = true});
  fs::create_directories(out);
  const auto plot = out / "lr_find.svg";
  const auto found = learn->lr_find({.plot = plot});
  fmt::print(
      "suggested learning rates (fastai's rules): minimum {:.2e}, steep {:.2e}, slide {:.2e}, valley {:.2e}; "
      "plot in {}\n",
      found.minimum, found.steep, found.slide, found.valley, excerpt(plot.string(), 256));
  return 0;
}

}  // namespace fastlearn::cli
