#include "cli/run.h"

#include "cli/run_folder.h"

#include <fastlearn/core/atomic_file.h>
#include <fastlearn/core/detail/text.h>
#include <fastlearn/data/detail/file_lock.h>
#include <fastlearn/fastlearn.h>

#include <ATen/CPUGeneratorImpl.h>
#include <torch/cuda.h>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <map>
#include <optional>
#include <utility>

namespace fastlearn::cli {

namespace fs = std::filesystem;

namespace {

bool under_launcher() { return std::getenv("RANK") != nullptr; }

// A restart by the launcher (--max-restarts) continues from the last checkpoint.
bool restarted_by_launcher() {
  const char* count = std::getenv("TORCHELASTIC_RESTART_COUNT");
  return count && std::atoi(count) > 0;
}

// y = x . w + b + noise with x ~ N(0, 1); w, b and the noise all drawn from the seed.
DataLoaders synthetic_regression(const DataConfig& d) {
  const auto& s = d.synthetic;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(static_cast<std::uint64_t>(s.seed));
  const auto w = at::randn({s.features, 1}, gen);
  const auto b = at::randn({1}, gen);
  auto make = [&](std::int64_t n) {
    auto x = at::randn({n, s.features}, gen);
    auto y = x.mm(w) + b + s.noise * at::randn({n, 1}, gen);
    return std::make_shared<TensorDataset>(std::vector<at::Tensor>{x}, std::vector<at::Tensor>{y});
  };
  auto train = make(s.n_train);
  auto valid = make(s.n_valid);
  return DataLoaders(
      DataLoader(train, {.bs = d.bs, .shuffle = true, .num_workers = static_cast<int>(d.workers)}),
      DataLoader(valid, {.bs = d.valid_bs > 0 ? d.valid_bs : 2 * d.bs, .num_workers = static_cast<int>(d.workers)}), 1);
}

// The user's image files: class folders, or a CSV table of file names and labels.
DataLoaders image_files(const TrainConfig& c) {
  const auto& d = c.data;
  const auto& t = d.transforms;
  const ImageFilesOptions options{.bs = d.bs,
                                  .valid_bs = d.valid_bs,
                                  .num_workers = static_cast<int>(d.workers),
                                  .seed = static_cast<std::uint64_t>(c.train.seed),
                                  .size = d.size,
                                  .method = resize_method(t.resize),
                                  .pad_mode = pad_mode(t.pad_mode),
                                  .min_scale = t.min_scale,
                                  .flip_p = t.random_flip,
                                  .normalize = !t.normalize            ? ImageNormalization::none
                                               : t.stats == "computed" ? ImageNormalization::computed
                                                                       : ImageNormalization::imagenet,
                                  .skip_bad_images = d.skip_bad_images,
                                  .valid_pct = d.valid_pct,
                                  .split_seed = static_cast<std::uint64_t>(c.train.seed),
                                  .augment = t.augment ? std::optional(AugOptions{}) : std::nullopt};
  if (d.dataset == "image_csv") {
    return ImageDataLoaders::from_csv(fs::path(d.path) / d.csv,
                                      {.fn_col = d.fn_col,
                                       .label_col = d.label_col,
                                       .valid_col = d.valid_col,
                                       .label_delim = d.label_delim,
                                       .delimiter = d.delimiter.front()},
                                      options);
  }
  return ImageDataLoaders::from_folder(d.path, options);
}

// The config's table options; data.y_block empty (not decided yet) leaves regression to the data.
TabularOptions tabular_options(const TrainConfig& c) {
  const auto& d = c.data;
  return {.y_names = d.y_names,
          .cat_names = d.cat_names,
          .cont_names = d.cont_names,
          .procs = d.procs,
          .regression = d.y_block.empty() ? std::nullopt : std::optional(d.y_block == "regression"),
          .valid_col = d.valid_col,
          .valid_pct = d.valid_pct,
          .split_seed = static_cast<std::uint64_t>(c.train.seed),
          .bs = d.bs,
          .valid_bs = d.valid_bs,
          .num_workers = static_cast<int>(d.workers),
          .seed = static_cast<std::uint64_t>(c.train.seed),
          .delimiter = d.delimiter.front()};
}

DataLoaders tabular_data(const TrainConfig& c) { return TabularDataLoaders::from_csv(c.data.path, tabular_options(c)); }

// data.y_block when the config leaves it out: what TabularDataLoaders decides from the CSV file's training rows
// (so the loss and metrics the config checks are those of the task the data makes).
std::optional<bool> regression_of_data(const TrainConfig& c) {
  if (!fs::is_regular_file(c.data.path)) return std::nullopt;  // the command says what is wrong with data.path
  const auto table = read_csv(c.data.path, {.delimiter = c.data.delimiter.front()});
  return TabularDataLoaders::regression(table, tabular_options(c), c.data.path);
}

// The config of every command, data.y_block decided from the data when it is not given.
// train.device and distributed.backend against this host's GPUs, for `local_ranks` ranks on it: refused before
// anything is launched, loaded or written, naming the numbers and the ways out.
void check_devices(const TrainConfig& c, int local_ranks, const std::string& origin) {
  const int gpus = torch::cuda::is_available() ? static_cast<int>(torch::cuda::device_count()) : 0;
  const auto& device = c.train.device;
  const auto& backend = c.distributed.backend;
  const bool one_gpu = device.starts_with("cuda:");
  if (backend == "nccl" && gpus == 0)
    throw ConfigError(
        fmt::format("{}: distributed.backend = \"nccl\" needs a CUDA GPU and none is visible; use "
                    "\"gloo\", or \"auto\" (NCCL when every rank has a GPU, Gloo otherwise)",
                    excerpt(origin, 256)));
  if (device != "auto" && device != "cpu" && gpus == 0)
    throw ConfigError(
        fmt::format("{}: train.device = \"{}\" needs a CUDA GPU and none is visible; use \"cpu\", or "
                    "\"auto\" (a GPU when there is one)",
                    excerpt(origin, 256), device));
  if (one_gpu && std::stoi(device.substr(5)) >= gpus)
    throw ConfigError(fmt::format("{}: train.device = \"{}\": this host has {} GPU(s), cuda:0{}", excerpt(origin, 256),
                                  device, gpus, gpus > 1 ? fmt::format(" to cuda:{}", gpus - 1) : ""));
  if (local_ranks <= 1) return;
  if (one_gpu)
    throw ConfigError(
        fmt::format("{}: train.device = \"{}\" names one GPU, and {} ranks train on this host: use "
                    "\"cuda\" (each rank its own GPU) or \"auto\"",
                    excerpt(origin, 256), device, local_ranks));
  if (backend == "nccl" && device == "cpu")
    throw ConfigError(
        fmt::format("{}: distributed.backend = \"nccl\" trains on GPUs, and train.device = \"cpu\": "
                    "use the gloo backend (or \"auto\") to train on the CPU",
                    excerpt(origin, 256)));
  if ((device == "cuda" || backend == "nccl") && local_ranks > gpus)
    throw ConfigError(fmt::format(
        "{}: {} needs a GPU for each of the {} ranks on this host, and it has {}: start at most {} rank(s) per host "
        "(--nproc-per-node {}), or leave train.device and distributed.backend at \"auto\" (with fewer GPUs than "
        "ranks the ranks then train on the CPU over Gloo), or set train.device = \"cpu\"",
        excerpt(origin, 256), device == "cuda" ? "train.device = \"cuda\"" : "distributed.backend = \"nccl\"",
        local_ranks, gpus, std::max(gpus, 1), std::max(gpus, 1)));
}

TrainConfig read_config_file(const TrainArgs& args) {
  auto config = load_config(args.config_path, args.sets, regression_of_data);
  check_devices(config, local_world_size(), args.config_path);
  return config;
}

DataLoaders make_data(const TrainConfig& c) {
  const auto& d = c.data;
  if (d.dataset == "synthetic_regression") return synthetic_regression(d);
  if (is_tabular(d)) return tabular_data(c);
  if (is_image_files(d)) return image_files(c);
  fs::path dir = d.path;
  if (dir.empty()) {
    dir = rank0_first([&] { return d.url.empty() ? untar_data(urls::fashion_mnist()) : untar_data(d.url); });
  }
  const auto& t = d.transforms;
  return ImageDataLoaders::from_idx(dir, {.bs = d.bs,
                                          .valid_bs = d.valid_bs,
                                          .num_workers = static_cast<int>(d.workers),
                                          .seed = static_cast<std::uint64_t>(c.train.seed),
                                          .normalize = t.normalize,
                                          .augment = t.random_crop_padding > 0 || t.random_flip > 0,
                                          .crop_padding = t.random_crop_padding,
                                          .flip_p = t.random_flip});
}

torch::nn::Sequential make_model(const TrainConfig& c, DataLoaders& dls) {
  const auto& m = c.model;
  const bool images = is_images(c.data);
  const std::int64_t outputs = dls.c();
  if (is_image_files(c.data)) {
    return models::vision_model(
        {.arch = m.arch, .classes = outputs, .weights = m.weights, .in_channels = image_channels(dls)});
  }
  if (m.arch == "simple_cnn") return models::simple_cnn(outputs);
  if (m.arch == "conv_net") return models::conv_net({.widths = m.widths, .classes = outputs});
  if (m.arch == "resnet")
    return models::resnet({.widths = m.widths,
                           .blocks_per_stage = m.blocks_per_stage,
                           .classes = outputs,
                           .in_channels = 1,
                           .stem_width = m.stem_width});
  const std::int64_t inputs = images ? 28 * 28 : c.data.synthetic.features;
  return models::mlp(inputs, m.hidden, outputs);
}

OptFunc make_opt(const TrainSectionConfig& t) {
  if (t.optimizer == "sgd") return SGD({.mom = t.momentum});
  if (t.optimizer == "adamw") return AdamW();
  return Adam();
}

Loss make_loss(const TrainSectionConfig& t) {
  if (t.loss == "mse") return mse_loss();
  if (t.loss == "l1") return l1_loss();
  if (t.loss == "bce_with_logits") return bce_with_logits();
  return cross_entropy();
}

std::vector<MetricPtr> make_metrics(const TrainSectionConfig& t) {
  std::vector<MetricPtr> metrics;
  for (const auto& name : t.metrics) {
    if (name == "accuracy")
      metrics.push_back(accuracy());
    else if (name == "error_rate")
      metrics.push_back(error_rate());
    else if (name == "top_k_accuracy")
      metrics.push_back(top_k_accuracy(static_cast<int>(t.top_k)));
    else if (name == "f1_macro")
      metrics.push_back(f1_macro());
    else if (name == "accuracy_multi")
      metrics.push_back(accuracy_multi());
    else if (name == "fbeta_multi")
      metrics.push_back(fbeta_multi());
    else if (name == "rmse")
      metrics.push_back(rmse());
    else if (name == "mse")
      metrics.push_back(mse());
    else if (name == "mae")
      metrics.push_back(mae());
  }
  return metrics;
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

LearnerOptions learner_options(const TrainConfig& c, const fs::path& out, bool with_run_callbacks, bool resume) {
  LearnerOptions o{.opt_func = make_opt(c.train),
                   .lr = c.train.lr,
                   .wd = c.train.wd,
                   .metrics = make_metrics(c.train),
                   .path = out,
                   .model_dir = "checkpoints"};
  const auto& t = c.train;
  o.wd_bn_bias = t.wd_bn_bias;
  if (t.device != "auto") o.device = c10::Device(t.device);  // "cuda" without an index: the rank's GPU
  if (t.grad_accumulation > 0) o.cbs.push_back(std::make_shared<GradientAccumulation>(t.grad_accumulation));
  if (t.grad_clip > 0) o.cbs.push_back(std::make_shared<GradientClip>(GradientClipOptions{.max_norm = t.grad_clip}));
  if (t.mixed_precision) o.cbs.push_back(std::make_shared<MixedPrecision>());
  if (channels_last_on(c)) o.cbs.push_back(std::make_shared<ChannelsLast>());
  if (!with_run_callbacks) return o;
  o.cbs.push_back(std::make_shared<MetricsJson>());
  const auto& cb = c.callbacks;
  if (cb.csv_log) o.cbs.push_back(std::make_shared<CSVLogger>(CSVLoggerOptions{.append = resume}));
  if (const auto& e = cb.early_stopping)
    o.cbs.push_back(std::make_shared<EarlyStopping>(EarlyStoppingOptions{
        .tracker = {.monitor = e->monitor, .min_delta = e->min_delta}, .patience = static_cast<int>(e->patience)}));
  if (const auto& b = cb.save_best) {
    SaveModelOptions save{.fname = "best"};  // (a nested designated initializer trips GCC 12's -O3 maybe-uninitialized)
    save.tracker.monitor = b->monitor;
    o.cbs.push_back(std::make_shared<SaveModel>(save));
  }
  if (cb.tensorboard)
    o.cbs.push_back(std::make_shared<TensorBoardLogger>(TensorBoardOptions{.log_dir = "tensorboard"}));
  if (c.output.checkpoints)
    o.cbs.push_back(std::make_shared<Checkpointer>(
        CheckpointerOptions{.dir = "checkpoints", .every_n_batches = c.output.checkpoint_every_n_batches}));
  o.cbs.push_back(std::make_shared<GracefulStop>());  // Ctrl-C / SIGTERM: stop at a batch end with a checkpoint
  return o;
}

std::unique_ptr<Learner> make_learner(const TrainConfig& c, const fs::path& out, bool with_run_callbacks,
                                      bool resume = false) {
  set_seed(static_cast<std::uint64_t>(c.train.seed));
  auto dls = make_data(c);
  // Checked with the data, before the run folder is taken over (the metric would fail after the first epoch).
  const auto& metrics = c.train.metrics;
  if (std::find(metrics.begin(), metrics.end(), "top_k_accuracy") != metrics.end() && c.train.top_k > dls.c()) {
    throw ConfigError(
        fmt::format("train.metrics: top_k_accuracy with train.top_k = {} needs at least {} classes; the "
                    "data has {}: set train.top_k to at most {}",
                    c.train.top_k, c.train.top_k, dls.c(), dls.c()));
  }
  if (is_tabular(c.data)) {
    auto model = tabular_model(dls, {.layers = c.model.layers, .embed_p = c.model.embed_p});
    return std::make_unique<Learner>(std::move(dls), model, make_loss(c.train),
                                     learner_options(c, out, with_run_callbacks, resume));
  }
  auto model = make_model(c, dls);
  return std::make_unique<Learner>(std::move(dls), model, make_loss(c.train),
                                   learner_options(c, out, with_run_callbacks, resume));
}

// The config's learner with the checkpoint's weights (validate, interpret, predict); loading also checks the
// saved class names and tabular procs against the data's.
std::unique_ptr<Learner> learner_from_checkpoint(const TrainConfig& c, const fs::path& out,
                                                 const std::string& checkpoint, const char* command) {
  if (!fs::exists(checkpoint))
    throw CheckpointError(fmt::format("{}: checkpoint '{}' does not exist", command, excerpt(checkpoint, 256)));
  auto learn = make_learner(c, out, /*with_run_callbacks=*/false);
  try {
    load_checkpoint(*learn, checkpoint, {.with_opt = false});
  } catch (const CheckpointError& e) {
    // Most often the run was trained with --set overrides the config given here lacks; its folder has them all.
    const auto run_config = fs::path(checkpoint).parent_path().parent_path() / "config.toml";
    if (!fs::is_regular_file(run_config)) throw;
    throw CheckpointError(
        fmt::format("{}\nThe run that saved it left its resolved config in '{}': `fastlearn {} {} "
                    "--checkpoint {}` builds the same data and model",
                    e.what(), excerpt(run_config.string(), 256), command, excerpt(run_config.string(), 256),
                    excerpt(checkpoint, 256)));
  }
  return learn;
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

void fit(Learner& learn, const TrainSectionConfig& t, const std::optional<fs::path>& resume_from,
         std::vector<CallbackPtr> cbs) {
  const int epochs = static_cast<int>(t.epochs);
  const FitOptions options{.cbs = std::move(cbs), .resume_from = resume_from.value_or(fs::path())};
  if (t.schedule == "one_cycle")
    learn.fit_one_cycle(epochs, t.lr, {.pct_start = t.pct_start, .fit = options});
  else if (t.schedule == "fine_tune")
    learn.fine_tune(epochs, t.lr, {.pct_start = t.pct_start, .fit = options});
  else if (t.schedule == "flat_cos")
    learn.fit_flat_cos(epochs, t.lr, {.pct_start = t.pct_start, .fit = options});
  else
    learn.fit(epochs, t.lr, options);
}

SetupOptions setup_options(const DistributedConfig& d) {
  SetupOptions o{.timeout = std::chrono::milliseconds(static_cast<std::int64_t>(d.timeout_seconds * 1000))};
  if (d.backend == "gloo") o.backend = BackendKind::gloo;
  if (d.backend == "nccl") o.backend = BackendKind::nccl;
  return o;
}

DistributedTrainerOptions trainer_options(const DistributedConfig& d) {
  return {.sync_bn = d.sync_bn,
          .reducer = {.first_bucket_mb = d.first_bucket_mb,
                      .bucket_cap_mb = d.bucket_cap_mb,
                      .find_unused_parameters = d.find_unused_parameters}};
}

std::string format_metric(const std::string& name, double value) {
  if (name == "accuracy" || name == "error_rate" || name == "top_k_accuracy")
    return fmt::format("{} {:.2f}%", name, 100 * value);
  return fmt::format("{} {:.4f}", name, value);
}

std::string describe(const ValidationResult& r) {
  std::string text = fmt::format("loss {:.4f}", r.loss);
  for (const auto& [name, value] : r.metrics) text += ", " + format_metric(name, value);
  return text;
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
  const fs::path out = args.out.empty() ? fs::path(config.output.dir) : fs::path(args.out);
  config.output.dir = out.string();
  // The ranks on this host: the launch about to start them, or the job this process is one of.
  check_devices(config, under_launcher() ? local_world_size() : std::max(args.nproc_per_node, 1), args.config_path);
  // A relative data.path is the working directory's, as for every command-line tool: say which folder that was.
  const auto relative_to = [](const std::string& path) {
    return fs::path(path).is_relative()
               ? fmt::format(" (relative to the working directory {})", excerpt(fs::current_path().string(), 256))
               : std::string();
  };
  if (is_tabular(config.data) && !fs::is_regular_file(config.data.path))
    throw ConfigError(fmt::format("{}: data.path '{}'{} is not a file; point it at the CSV file",
                                  excerpt(args.config_path, 256), excerpt(config.data.path, 256),
                                  relative_to(config.data.path)));
  if (!is_tabular(config.data) && !config.data.path.empty() && !fs::is_directory(config.data.path)) {
    const char* hint = config.data.dataset == "image_folder" ? "point it at the folder of class folders (or of train/ "
                                                               "and valid/)"
                       : config.data.dataset == "image_csv"  ? "point it at the folder holding data.csv's table "
                                                               "and the images"
                       : config.data.dataset == "fashion_mnist"
                           ? "point it at an MNIST-format folder, or leave it out to use the default Fashion-MNIST"
                           : "point it at the data's folder";
    throw ConfigError(fmt::format("{}: data.path '{}'{} (data.dataset = \"{}\") is not a folder; {}",
                                  excerpt(args.config_path, 256), excerpt(config.data.path, 256),
                                  relative_to(config.data.path), config.data.dataset, hint));
  }
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
    learn = make_learner(config, out, /*with_run_callbacks=*/true, resume);
    DistribCtx ctx(*learn, trainer_options(config.distributed), setup_options(config.distributed));
    if (is_main()) {
      const auto where = describe_device(learn->device());
      if (world_size() > 1)
        fmt::print("training on {} ranks over {}; rank 0 on {}\n", world_size(), to_string(world_group().kind()),
                   where);
      else
        fmt::print("training on {}\n", where);
      std::fflush(stdout);
    }
    // A fresh run looks for no checkpoint, and only rank 0 writes them: its RunFolder sets the older run's aside.
    fit(*learn, config.train, resume ? checkpoint_to_resume(out) : std::nullopt,
        {std::make_shared<RunFolder>(out, to_toml(config), /*fresh=*/!resume)});
    if (const auto stop = learn->cb<GracefulStop>(); stop && stop->stopped()) {
      const int signal = stop_signal() != 0 ? stop_signal() : SIGTERM;  // 0 here: another rank got it
      if (is_main())
        fmt::print(stderr, "fastlearn train: stopped by signal {}; `--resume` continues from the last checkpoint\n",
                   signal);
      return 128 + signal;
    }
    result = learn->validate();  // on every rank: gathered, exact
    learn->save("model", {.with_opt = false});
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
  auto learn = make_learner(config, out, /*with_run_callbacks=*/false);
  fs::create_directories(out);
  const auto plot = out / "lr_find.svg";
  const auto found = learn->lr_find({.plot = plot});
  fmt::print(
      "suggested learning rates (fastai's rules): minimum {:.2e}, steep {:.2e}, slide {:.2e}, valley {:.2e}; "
      "plot in {}\n",
      found.minimum, found.steep, found.slide, found.valley, excerpt(plot.string(), 256));
  return 0;
}

int run_validate(const TrainArgs& args, const std::string& checkpoint) {
  auto config = read_config_file(args);
  auto learn = learner_from_checkpoint(config, config.output.dir, checkpoint, "validate");
  const auto result = learn->validate();
  fmt::print("{} set: {}\n", config.data.dataset == "fashion_mnist" ? "test" : "validation", describe(result));
  return 0;
}

int run_interpret(const TrainArgs& args, const std::string& checkpoint, int top) {
  auto config = read_config_file(args);
  if (!is_classification(config.data) || is_multi_label(config.data)) {
    throw ConfigError(
        fmt::format("interpret: {} is not single-label classification (data.dataset = \"{}\"); "
                    "interpret reads a classifier's confusions",
                    excerpt(args.config_path, 256), config.data.dataset));
  }
  const fs::path out = args.out.empty() ? fs::path(config.output.dir) : fs::path(args.out);
  auto learn = learner_from_checkpoint(config, out, checkpoint, "interpret");
  const auto interp = ClassificationInterpretation::from_learner(*learn);
  const auto& vocab = interp.vocab();
  const auto cm = interp.confusion_matrix();
  const auto* counts = cm.data_ptr<std::int64_t>();
  const auto c = static_cast<std::int64_t>(vocab.size());
  std::string table = "actual," + fmt::format("{}", fmt::join(vocab, ",")) + "\n";
  // Columns as wide as the longest class name (at least 6), headed by the predicted class's name.
  std::size_t width = 6;
  for (const auto& name : vocab) width = std::max(width, name.size());
  fmt::print("confusion matrix (rows: actual, columns: predicted)\n{:>{}}", "", width);
  for (const auto& name : vocab) fmt::print(" {:>{}}", name, width);
  fmt::print("\n");
  for (std::int64_t a = 0; a < c; ++a) {
    const auto& name = vocab[static_cast<std::size_t>(a)];
    std::vector<std::int64_t> row(counts + a * c, counts + (a + 1) * c);
    fmt::print("{:>{}}", name, width);
    for (auto n : row) fmt::print(" {:>{}}", n, width);
    fmt::print("\n");
    table += fmt::format("{},{}\n", name, fmt::join(row, ","));
  }
  fmt::print("most confused (actual -> predicted: items):\n");
  const auto confused = interp.most_confused();
  for (std::size_t i = 0; i < std::min<std::size_t>(confused.size(), 10); ++i) {
    fmt::print("  {} -> {}: {}\n", confused[i].actual, confused[i].predicted, confused[i].count);
  }
  fs::create_directories(out);
  write_file_atomically(out / "confusion_matrix.csv", table);
  if (!is_images(config.data)) {
    fmt::print("top losses (validation row, counted from 0: actual, predicted (its probability), loss):\n");
    for (const auto& item : interp.top_losses(top)) {
      fmt::print("  {}: {}, {} ({:.3f}), {:.3f}\n", item.index, item.actual, item.predicted, item.probability,
                 item.loss);
    }
    fmt::print("wrote {}\n", excerpt((out / "confusion_matrix.csv").string(), 256));
    return 0;
  }
  save_top_losses_grid(interp, learn->dls().valid().dataset(), top, out / "top_losses.svg");
  fmt::print("wrote {} and {}\n", excerpt((out / "confusion_matrix.csv").string(), 256),
             excerpt((out / "top_losses.svg").string(), 256));
  return 0;
}

namespace {

// The columns of `table` that the model reads, by name, with their index. A CSV without one of them is a mistake far
// more often than a column of missing cells (pandas, and so fastai, fail on it too): refused, naming the columns. An
// empty cell still counts as missing. Other columns (the target, an id) are left out.
std::map<std::string, std::size_t> input_columns(Learner& learn, const CsvTable& table, const std::string& file) {
  const auto* dataset = tabular_dataset(learn.dls());
  if (!dataset) return {};
  std::map<std::string, std::size_t> inputs;
  std::vector<std::string> absent;
  for (const auto* names : {&dataset->procs().cat_columns(), &dataset->procs().cont_names()})
    for (const auto& name : *names) {
      const auto at = std::find(table.columns.begin(), table.columns.end(), name);
      if (at == table.columns.end())
        absent.push_back(name);
      else
        inputs.emplace(name, static_cast<std::size_t>(at - table.columns.begin()));
    }
  if (!absent.empty())
    throw DataError(
        fmt::format("{}: no column {} that the model reads (the header has {}); give it, with empty "
                    "cells where a value is missing",
                    excerpt(file, 256), fmt::join(excerpts(absent), ", "), fmt::join(excerpts(table.columns), ", ")));
  return inputs;
}

}  // namespace

int run_predict(const TrainArgs& args, const std::string& checkpoint, const std::vector<std::string>& inputs) {
  auto config = read_config_file(args);
  if (!is_image_files(config.data) && !is_tabular(config.data)) {
    throw ConfigError(
        fmt::format("predict: {} has data.dataset = \"{}\"; predict takes image files (data.dataset = "
                    "\"image_folder\" or \"image_csv\") or CSV rows (data.dataset = \"csv\")",
                    excerpt(args.config_path, 256), config.data.dataset));
  }
  auto learn = learner_from_checkpoint(config, config.output.dir, checkpoint, "predict");
  int failed = 0;
  for (const auto& input : inputs) {
    try {
      if (is_tabular(config.data)) {
        // Every row of the CSV file, one line each: FILE:ROW (the header is row 1).
        const auto table = read_csv(input, {.delimiter = config.data.delimiter.front()});
        const auto columns = input_columns(*learn, table, input);  // other columns may be there too
        for (std::size_t r = 0; r < table.rows.size(); ++r) {
          std::map<std::string, std::string> row;
          for (const auto& [name, j] : columns) row[name] = table.rows[r][j];
          const auto where = fmt::format("{}:{}", input, r + 2);
          try {
            fmt::print("{}\t{}\n", where, describe(predict_row(*learn, row, where)));
          } catch (const DataError& e) {  // the error names `where`
            std::fflush(stdout);
            fmt::print(stderr, "fastlearn: error: {}\n", e.what());
            ++failed;
          }
        }
      } else if (std::filesystem::is_directory(input)) {
        // Every image file under the folder, as from_folder finds them, one line each.
        const auto files = get_image_files(input);
        if (files.empty())
          throw DataError(fmt::format("{}: a folder with no .jpg, .jpeg or .png file in it", excerpt(input, 256)));
        for (const auto& file : files) {
          try {
            fmt::print("{}\t{}\n", file.string(), describe(predict_image(*learn, file)));
          } catch (const DataError& e) {
            std::fflush(stdout);
            fmt::print(stderr, "fastlearn: error: {}\n", e.what());
            ++failed;
          }
        }
      } else {
        fmt::print("{}\t{}\n", input, describe(predict_image(*learn, input)));
      }
    } catch (const DataError& e) {
      std::fflush(stdout);
      fmt::print(stderr, "fastlearn: error: {}\n", e.what());
      ++failed;
    }
  }
  return failed == 0 ? 0 : 1;
}

}  // namespace fastlearn::cli
