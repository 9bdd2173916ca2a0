#include <fastlearn/config/learner_from_config.h>

#include <fastlearn/callbacks/channels_last.h>
#include <fastlearn/callbacks/checkpointing.h>
#include <fastlearn/callbacks/epoch_logs.h>
#include <fastlearn/callbacks/graceful_stop.h>
#include <fastlearn/callbacks/grad_accumulation.h>
#include <fastlearn/callbacks/grad_clip.h>
#include <fastlearn/callbacks/mixed_precision.h>
#include <fastlearn/callbacks/save_model.h>
#include <fastlearn/callbacks/tensorboard.h>
#include <fastlearn/callbacks/tracker.h>
#include <fastlearn/config/data_from_config.h>
#include <fastlearn/config/load_learner.h>
#include <fastlearn/config/registry.h>
#include <fastlearn/core/detail/text.h>
#include <fastlearn/core/random.h>

#include <torch/cuda.h>

#include <fmt/format.h>

#include <algorithm>

namespace fastlearn {

namespace {

LearnerOptions learner_options(const TrainConfig& c, const LearnerFromConfigOptions& from) {
  const auto& t = c.train;
  LearnerOptions o{.opt_func = find_optimizer(c).make(c),
                   .lr = t.lr,
                   .wd = t.wd,
                   .path = from.out.empty() ? std::filesystem::path(c.output.dir) : from.out,
                   .model_dir = "checkpoints"};
  for (const auto& name : t.metrics) o.metrics.push_back(find_metric(name, c).make(c));
  o.wd_bn_bias = t.wd_bn_bias;
  o.progress = from.progress;
  o.cuda_graph = t.cuda_graph;
  if (t.device != "auto") o.device = c10::Device(t.device);  // "cuda" without an index: the rank's GPU
  if (t.grad_accumulation > 0) o.cbs.push_back(std::make_shared<GradientAccumulation>(t.grad_accumulation));
  if (t.grad_clip > 0) o.cbs.push_back(std::make_shared<GradientClip>(GradientClipOptions{.max_norm = t.grad_clip}));
  if (t.mixed_precision) {
    MixedPrecisionOptions precision;
    if (t.mixed_precision_dtype == "bf16") precision.dtype = at::kBFloat16;
    if (t.mixed_precision_dtype == "fp16") precision.dtype = at::kHalf;
    o.cbs.push_back(std::make_shared<MixedPrecision>(precision));
  }
  if (channels_last_on(c)) o.cbs.push_back(std::make_shared<ChannelsLast>());
  if (!from.run_callbacks) return o;
  o.cbs.push_back(std::make_shared<MetricsJson>());
  const auto& cb = c.callbacks;
  if (cb.csv_log) o.cbs.push_back(std::make_shared<CSVLogger>());
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
  if (c.train.handle_signals)  // Ctrl-C / SIGTERM: stop at a batch end with a checkpoint
    o.cbs.push_back(std::make_shared<GracefulStop>());
  return o;
}

}  // namespace

std::unique_ptr<Learner> learner_from_config(const TrainConfig& config, const LearnerFromConfigOptions& options) {
  // Checked as a value as a file would be, which also fills in what a hand-built config leaves empty (the loss); a
  // parsed config comes back unchanged.
  const auto c = options.checked ? config : check_config(config);
  set_seed(static_cast<std::uint64_t>(c.train.seed));
  // The names first: an unknown one fails before the data is read.
  const auto arch = find_arch(c);
  auto loss = find_loss(c).make(c);
  auto learner_opts = learner_options(c, options);
  auto dls = dataloaders_from_config(c);
  // Checked with the data, before a run folder is taken over (the metric would fail after the first epoch).
  const auto& metrics = c.train.metrics;
  if (std::find(metrics.begin(), metrics.end(), "top_k_accuracy") != metrics.end() && c.train.top_k > dls.c()) {
    throw ConfigError(
        fmt::format("train.metrics: top_k_accuracy with train.top_k = {} needs at least {} classes; the "
                    "data has {}: set train.top_k to at most {}",
                    c.train.top_k, c.train.top_k, dls.c(), dls.c()));
  }
  auto model = arch.make(c, dls);
  learner_opts.model_recipe = model_recipe(c);
  if (model.replicate) learner_opts.replicate = std::move(model.replicate);
  if (model.splitter && !learner_opts.splitter) learner_opts.splitter = std::move(model.splitter);
  return std::make_unique<Learner>(std::move(dls), std::move(model.module), std::move(model.forward), std::move(loss),
                                   std::move(learner_opts));
}

void fit_from_config(Learner& learn, const TrainConfig& config, const FitOptions& options) {
  if (config.data.dataset == "program")
    throw ConfigError(
        "data.dataset = \"program\": the samples come from a running program, which hands them to the Learner's "
        "train_step (the step API: begin_steps(step_plan(config), step_fit(config))) or to the C interface's "
        "fl_train_step; there is nothing to train on from the config alone");
  find_schedule(config).fit(learn, config, options);
}

StepPlan step_plan(const TrainConfig& config) {
  const auto& d = config.data;
  if (d.dataset != "program")
    throw ConfigError(fmt::format(
        "step_plan: data.dataset = \"{}\" reads its data itself; the steps of a config are those of dataset = "
        "\"program\"",
        excerpt(d.dataset)));
  return {.steps = config.train.epochs * d.steps_per_epoch,
          .steps_per_epoch = d.steps_per_epoch,
          .held_out = d.held_out,
          .valid_bs = d.valid_bs > 0 ? d.valid_bs : 2 * d.bs};
}

StepFit step_fit(const TrainConfig& config, const FitOptions& options) {
  return [schedule = find_schedule(config), config, options](Learner& learn, int n_epoch) {
    auto c = config;
    c.train.epochs = n_epoch;
    schedule.fit(learn, c, options);
  };
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
                      .find_unused_parameters = d.find_unused_parameters},
          .shard = shard_from_name(d.shard),
          .shard_units = d.shard_units};
}

std::vector<c10::Device> parallel_devices(const DistributedConfig& d) {
  if (d.devices.size() == 1 && d.devices.front() == "cuda") return all_gpus();
  std::vector<c10::Device> out;
  for (const auto& name : d.devices) out.emplace_back(name);
  return out;
}

ParallelTrainerOptions parallel_options(const DistributedConfig& d) {
  return {.sync_bn = d.sync_bn,
          .reducer = {.first_bucket_mb = d.first_bucket_mb,
                      .bucket_cap_mb = d.bucket_cap_mb,
                      .find_unused_parameters = d.find_unused_parameters},
          .timeout = std::chrono::milliseconds(static_cast<std::int64_t>(d.timeout_seconds * 1000))};
}

void check_devices(const TrainConfig& c, int local_ranks, const std::string& origin) {
  const int gpus = torch::cuda::is_available() ? static_cast<int>(torch::cuda::device_count()) : 0;
  const auto& devices = c.distributed.devices;
  if (!devices.empty() && local_ranks > 1) {
    throw ConfigError(fmt::format(
        "{}: distributed.devices trains several devices in this one process, and {} ranks train on this host "
        "(--nproc-per-node {}): use one or the other",
        excerpt(origin, 256), local_ranks, local_ranks));
  }
  for (const auto& name : devices) {
    if (name == "cpu") continue;
    if (gpus == 0)
      throw ConfigError(fmt::format("{}: distributed.devices lists \"{}\", and no CUDA GPU is visible",
                                    excerpt(origin, 256), excerpt(name, 40)));
    if (name != "cuda" && std::stoi(name.substr(5)) >= gpus)
      throw ConfigError(fmt::format("{}: distributed.devices lists \"{}\": this host has {} GPU(s)",
                                    excerpt(origin, 256), excerpt(name, 40), gpus));
  }
  if (devices.size() == 1 && gpus < 2)
    throw ConfigError(
        fmt::format("{}: distributed.devices = [\"cuda\"] means every GPU, and this host has {}: give "
                    "at least two devices",
                    excerpt(origin, 256), gpus));
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

}  // namespace fastlearn
