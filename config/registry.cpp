#include <fastlearn/config/registry.h>

#include <fastlearn/core/detail/text.h>
#include <fastlearn/data/inference_pipeline.h>
#include <fastlearn/learner/collab_learner.h>
#include <fastlearn/learner/multi_label_metrics.h>
#include <fastlearn/learner/segmentation_loss.h>
#include <fastlearn/learner/segmentation_metrics.h>
#include <fastlearn/learner/tabular_learner.h>
#include <fastlearn/learner/torchscript_loss.h>
#include <fastlearn/learner/unet_learner.h>
#include <fastlearn/learner/vision_learner.h>
#include <fastlearn/models/models.h>
#include <fastlearn/models/torchscript.h>
#include <fastlearn/models/unet.h>
#include <fastlearn/models/vision_model.h>
#include <fastlearn/optim/adam.h>
#include <fastlearn/optim/sgd.h>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/nn/modules/linear.h>

#include <algorithm>
#include <mutex>

namespace fastlearn {

namespace {

constexpr std::initializer_list<Task> classification{Task::classification};
constexpr std::initializer_list<Task> multi_label{Task::multi_label};
constexpr std::initializer_list<Task> regression{Task::regression};
constexpr std::initializer_list<Task> segmentation{Task::segmentation};

// The inputs of one training item, flattened (an MLP's width): 28 x 28 for Fashion-MNIST, data.synthetic.features.
// Read from the data's description when it has one, so that loaders without items (load_learner's) give it too.
std::int64_t item_width(const DataLoaders& dls) {
  const auto pipeline = inference_pipeline(dls);
  if (pipeline.image) return pipeline.image->channels() * pipeline.image->size.height * pipeline.image->size.width;
  if (pipeline.kind == InferencePipeline::Kind::tensors) {
    std::int64_t width = 1;
    for (const auto d : pipeline.inputs.at(0).shape) width *= d;
    return width;
  }
  return dls.train().dataset().get(0).inputs.at(0).numel();
}

std::vector<LossChoice> builtin_losses() {
  return {{"cross_entropy", classification, [](const TrainConfig&) { return cross_entropy(); }},
          {"bce_with_logits", multi_label, [](const TrainConfig&) { return bce_with_logits(); }},
          {"mse", regression, [](const TrainConfig&) { return mse_loss(); }},
          {"l1", regression, [](const TrainConfig&) { return l1_loss(); }},
          {"pixel_cross_entropy", segmentation, [](const TrainConfig&) { return pixel_cross_entropy(); }},
          {"dice_loss", segmentation, [](const TrainConfig&) { return dice_loss(); }},
          {"cross_entropy_dice", segmentation, [](const TrainConfig&) { return cross_entropy_dice(); }},
          {"torchscript", {}, [](const TrainConfig& c) {
             return torchscript_loss(c.train.loss_file, {.activation = c.train.activation});
           }}};
}

std::vector<MetricChoice> builtin_metrics() {
  return {{"accuracy", classification, [](const TrainConfig&) { return accuracy(); }},
          {"error_rate", classification, [](const TrainConfig&) { return error_rate(); }},
          {"top_k_accuracy", classification,
           [](const TrainConfig& c) { return top_k_accuracy(static_cast<int>(c.train.top_k)); }},
          {"f1_macro", classification, [](const TrainConfig&) { return f1_macro(); }},
          {"accuracy_multi", multi_label, [](const TrainConfig&) { return accuracy_multi(); }},
          {"fbeta_multi", multi_label, [](const TrainConfig&) { return fbeta_multi(); }},
          {"rmse", regression, [](const TrainConfig&) { return rmse(); }},
          {"mse", regression, [](const TrainConfig&) { return mse(); }},
          {"mae", regression, [](const TrainConfig&) { return mae(); }},
          {"dice_multi", segmentation, [](const TrainConfig&) { return dice_multi(); }},
          {"dice", segmentation, [](const TrainConfig&) { return dice(); }},
          {"jaccard_coeff_multi", segmentation, [](const TrainConfig&) { return jaccard_coeff_multi(); }},
          {"jaccard_coeff", segmentation, [](const TrainConfig&) { return jaccard_coeff(); }},
          {"foreground_acc", segmentation, [](const TrainConfig&) { return foreground_acc(); }}};
}

std::vector<OptimizerChoice> builtin_optimizers() {
  return {{"adam", [](const TrainConfig&) { return Adam(); }},
          {"adamw", [](const TrainConfig&) { return AdamW(); }},
          {"sgd", [](const TrainConfig& c) { return SGD({.mom = c.train.momentum}); }}};
}

// NOLINTBEGIN(clang-analyzer-cplusplus.NewDeleteLeaks): the analyzer does not follow the model holder that
// the Learner::Forward std::function keeps on the heap to the function's destructor, which frees it.
std::vector<ArchChoice> builtin_archs() {
  const auto always = [](const TrainConfig&) { return true; };
  std::vector<ArchChoice> archs{
      {"simple_cnn",
       {"fashion_mnist"},
       [](const TrainConfig&, const DataLoaders& dls) { return BuiltModel::of(models::simple_cnn(dls.c())); },
       true},
      {"mlp",
       {"fashion_mnist", "synthetic_regression", "program"},
       [](const TrainConfig& c, const DataLoaders& dls) {
         auto model = models::mlp(item_width(dls), c.model.hidden, dls.c());
         // A program's targets of several dimensions: the outputs take their shape.
         if (const auto& target = c.data.target_shape; c.data.dataset == "program" && target.size() > 1)
           model->push_back(torch::nn::Unflatten(torch::nn::UnflattenOptions(1, target)));
         return BuiltModel::of(model);
       }},
      {"field_cnn",
       {"program"},
       [](const TrainConfig& c, const DataLoaders&) {
         const auto& in = c.data.input_shape;
         const auto& out = c.data.target_shape;
         const bool channels = in.size() == 3;
         return BuiltModel::of(models::field_cnn({.in_channels = channels ? in[0] : 1,
                                                  .out_channels = channels ? out[0] : 1,
                                                  .hidden = c.model.hidden,
                                                  .kernel_size = c.model.kernel_size,
                                                  .height = channels ? 0 : in[0]}));
       }},
      {"conv_net",
       {"fashion_mnist"},
       [](const TrainConfig& c, const DataLoaders& dls) {
         return BuiltModel::of(models::conv_net({.widths = c.model.widths, .classes = dls.c()}));
       },
       true,
       always},
      {"resnet",
       {"fashion_mnist"},
       [](const TrainConfig& c, const DataLoaders& dls) {
         const auto& m = c.model;
         return BuiltModel::of(models::resnet({.widths = m.widths,
                                               .blocks_per_stage = m.blocks_per_stage,
                                               .classes = dls.c(),
                                               .in_channels = 1,
                                               .stem_width = m.stem_width}));
       },
       true,
       always}};
  for (const char* torchvision : {"resnet18", "resnet34", "resnet50"}) {
    archs.push_back({torchvision,
                     {"image_folder", "image_csv"},
                     [](const TrainConfig& c, const DataLoaders& dls) {
                       auto built = BuiltModel::of(models::vision_model({.arch = c.model.arch,
                                                                         .classes = dls.c(),
                                                                         .weights = c.model.weights,
                                                                         .in_channels = image_channels(dls)}));
                       built.splitter = models::body_head_split;  // fine_tune freezes the body, as vision_learner's
                       return built;
                     },
                     true,
                     always});
  }
  // fastai's U-Net for the data's codes and item size (recorded in its pipeline, so that an export's empty loaders
  // build it too), with unet_split's three groups: fine_tune freezes the body.
  archs.push_back({"unet",
                   {"segmentation"},
                   [](const TrainConfig& c, const DataLoaders& dls) {
                     const auto* image = dls.image_pipeline();
                     if (image == nullptr) throw ConfigError("model.arch = \"unet\": the data records no image size");
                     auto built = BuiltModel::of(models::unet({.arch = c.model.body,
                                                               .classes = dls.c(),
                                                               .image_size = image->size,
                                                               .weights = c.model.weights,
                                                               .in_channels = image_channels(dls)}));
                     built.splitter = unet_split;
                     return built;
                   },
                   true,
                   always});
  // Its hidden layers hold BatchNorm (fastai's LinBnDrop), and so do the continuous inputs, which the data decides.
  archs.push_back({"tabular",
                   {"csv"},
                   [](const TrainConfig& c, const DataLoaders& dls) {
                     return BuiltModel::of(tabular_model(dls, {.layers = c.model.layers, .embed_p = c.model.embed_p}));
                   },
                   false,
                   [](const TrainConfig& c) { return !c.model.layers.empty(); }});
  // fastai's collab_learner models for a table of ratings: EmbeddingDotBias, or EmbeddingNN (BatchNorm in its layers).
  const auto collab = [](bool use_nn) {
    return [use_nn](const TrainConfig& c, const DataLoaders& dls) {
      const auto& r = c.model.y_range;
      auto built = collab_model(dls, {.n_factors = c.model.n_factors,
                                      .use_nn = use_nn,
                                      .layers = use_nn ? c.model.layers : std::vector<std::int64_t>{},
                                      .y_range = r.size() == 2 ? std::optional(std::pair(r[0], r[1])) : std::nullopt});
      return BuiltModel{std::move(built.module), std::move(built.forward), std::move(built.replicate), {}};
    };
  };
  archs.push_back({"collab", {"ratings"}, collab(false)});
  archs.push_back({"collab_nn", {"ratings"}, collab(true), false, always});
  // A model scripted in Python, for any data: the script's outputs must fit the data's targets and the loss.
  archs.push_back({"torchscript", dataset_names(), [](const TrainConfig& c, const DataLoaders&) {
                     return BuiltModel::of(models::torchscript(c.model.file));
                   }});
  return archs;
}
// NOLINTEND(clang-analyzer-cplusplus.NewDeleteLeaks)

std::vector<ScheduleChoice> builtin_schedules() {
  const auto epochs = [](const TrainConfig& c) { return static_cast<int>(c.train.epochs); };
  return {{"one_cycle",
           [=](Learner& learn, const TrainConfig& c, const FitOptions& fit) {
             learn.fit_one_cycle(epochs(c), c.train.lr, {.pct_start = c.train.pct_start, .fit = fit});
           }},
          {"flat_cos",
           [=](Learner& learn, const TrainConfig& c, const FitOptions& fit) {
             learn.fit_flat_cos(epochs(c), c.train.lr, {.pct_start = c.train.pct_start, .fit = fit});
           }},
          {"constant",
           [=](Learner& learn, const TrainConfig& c, const FitOptions& fit) { learn.fit(epochs(c), c.train.lr, fit); }},
          {"fine_tune", [=](Learner& learn, const TrainConfig& c, const FitOptions& fit) {
             learn.fine_tune(epochs(c), c.train.lr, {.pct_start = c.train.pct_start, .fit = fit});
           }}};
}

// The entries of every kind, built-in ones first; copies are handed out under the lock, so that an entry added
// on one thread never moves a vector another thread reads.
struct Registry {
  std::mutex mutex;
  std::vector<LossChoice> losses = builtin_losses();
  std::vector<MetricChoice> metrics = builtin_metrics();
  std::vector<OptimizerChoice> optimizers = builtin_optimizers();
  std::vector<ArchChoice> archs = builtin_archs();
  std::vector<ScheduleChoice> schedules = builtin_schedules();
};

Registry& registry() {
  static Registry instance;
  return instance;
}

template <class Choice>
std::vector<Choice> copy_of(std::vector<Choice> Registry::*table) {
  auto& r = registry();
  const std::lock_guard lock(r.mutex);
  return r.*table;
}

template <class Choice>
void add(std::vector<Choice> Registry::*table, Choice choice, std::string_view kind, bool has_factory) {
  const auto& name = choice.name;
  const bool spelled = !name.empty() && name.size() <= 64 && name.front() >= 'a' && name.front() <= 'z' &&
                       std::all_of(name.begin(), name.end(), [](char ch) {
                         return (ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9') || ch == '_';
                       });
  if (!spelled)
    throw ConfigError(
        fmt::format("add_choice: the {} name \"{}\" must be 1 to 64 lowercase letters, digits and '_', "
                    "starting with a letter",
                    kind, excerpt(name)));
  if (!has_factory) throw ConfigError(fmt::format("add_choice: the {} \"{}\" has no factory", kind, name));
  auto& r = registry();
  const std::lock_guard lock(r.mutex);
  auto& entries = r.*table;
  if (std::any_of(entries.begin(), entries.end(), [&](const Choice& e) { return e.name == name; }))
    throw ConfigError(fmt::format("add_choice: a {} named \"{}\" is there already", kind, name));
  entries.push_back(std::move(choice));
}

bool fits(const std::vector<Task>& tasks, Task task) {
  return tasks.empty() || std::find(tasks.begin(), tasks.end(), task) != tasks.end();
}
bool fits(const LossChoice& e, const TrainConfig& c) { return fits(e.tasks, task_of(c.data)); }
bool fits(const MetricChoice& e, const TrainConfig& c) { return fits(e.tasks, task_of(c.data)); }
bool fits(const ArchChoice& e, const TrainConfig& c) {
  return std::find(e.datasets.begin(), e.datasets.end(), c.data.dataset) != e.datasets.end();
}

template <class Choice>
std::vector<std::string> names_fitting(const std::vector<Choice>& entries, const TrainConfig& c) {
  std::vector<std::string> names;
  for (const auto& e : entries)
    if (fits(e, c)) names.push_back(e.name);
  return names;
}

template <class Choice>
std::vector<std::string> all_names(const std::vector<Choice>& entries) {
  std::vector<std::string> names;
  for (const auto& e : entries) names.push_back(e.name);
  return names;
}

// The entry `name` of `entries` (those that fit the config); ConfigError naming `key` otherwise.
template <class Choice>
Choice find(const std::vector<Choice>& entries, const std::string& name, std::string_view key,
            const std::vector<std::string>& fitting, std::string_view fit_for) {
  for (const auto& e : entries)
    if (e.name == name && std::find(fitting.begin(), fitting.end(), name) != fitting.end()) return e;
  throw ConfigError(fmt::format("{}: unknown {}\"{}\"{}; expected one of \"{}\"", key,
                                std::string_view(key) == "train.metrics" ? "metric " : "name ", excerpt(name), fit_for,
                                fmt::join(fitting, "\", \"")));
}

std::string task_words(const TrainConfig& c) { return fmt::format(" for {}", to_string(task_of(c.data))); }

}  // namespace

std::vector<LossChoice> loss_choices() { return copy_of(&Registry::losses); }
std::vector<MetricChoice> metric_choices() { return copy_of(&Registry::metrics); }
std::vector<OptimizerChoice> optimizer_choices() { return copy_of(&Registry::optimizers); }
std::vector<ArchChoice> arch_choices() { return copy_of(&Registry::archs); }
std::vector<ScheduleChoice> schedule_choices() { return copy_of(&Registry::schedules); }

void add_choice(LossChoice choice) {
  const bool has_factory = static_cast<bool>(choice.make);
  add(&Registry::losses, std::move(choice), "loss", has_factory);
}
void add_choice(MetricChoice choice) {
  const bool has_factory = static_cast<bool>(choice.make);
  add(&Registry::metrics, std::move(choice), "metric", has_factory);
}
void add_choice(OptimizerChoice choice) {
  const bool has_factory = static_cast<bool>(choice.make);
  add(&Registry::optimizers, std::move(choice), "optimizer", has_factory);
}
void add_choice(ArchChoice choice) {
  const auto& datasets = dataset_names();
  if (choice.datasets.empty())
    throw ConfigError(fmt::format("add_choice: the arch \"{}\" names no dataset whose items it reads (\"{}\")",
                                  excerpt(choice.name), fmt::join(datasets, "\", \"")));
  for (const auto& d : choice.datasets)
    if (std::find(datasets.begin(), datasets.end(), d) == datasets.end())
      throw ConfigError(fmt::format("add_choice: the arch \"{}\" names the unknown dataset \"{}\"; expected \"{}\"",
                                    excerpt(choice.name), excerpt(d), fmt::join(datasets, "\", \"")));
  const bool has_factory = static_cast<bool>(choice.make);
  add(&Registry::archs, std::move(choice), "arch", has_factory);
}
void add_choice(ScheduleChoice choice) {
  const bool has_factory = static_cast<bool>(choice.fit);
  add(&Registry::schedules, std::move(choice), "schedule", has_factory);
}

std::vector<std::string> loss_names(const TrainConfig& config) { return names_fitting(loss_choices(), config); }
std::vector<std::string> metric_names(const TrainConfig& config) { return names_fitting(metric_choices(), config); }
std::vector<std::string> arch_names(const TrainConfig& config) { return names_fitting(arch_choices(), config); }
std::vector<std::string> optimizer_names() { return all_names(optimizer_choices()); }
std::vector<std::string> schedule_names() { return all_names(schedule_choices()); }

LossChoice find_loss(const TrainConfig& config) {
  return find(loss_choices(), config.train.loss, "train.loss", loss_names(config), task_words(config));
}

MetricChoice find_metric(const std::string& name, const TrainConfig& config) {
  return find(metric_choices(), name, "train.metrics", metric_names(config), task_words(config));
}

OptimizerChoice find_optimizer(const TrainConfig& config) {
  return find(optimizer_choices(), config.train.optimizer, "train.optimizer", optimizer_names(), "");
}

ArchChoice find_arch(const TrainConfig& config) {
  return find(arch_choices(), config.model.arch, "model.arch", arch_names(config),
              fmt::format(" for dataset = \"{}\"", excerpt(config.data.dataset)));
}

ScheduleChoice find_schedule(const TrainConfig& config) {
  return find(schedule_choices(), config.train.schedule, "train.schedule", schedule_names(), "");
}

}  // namespace fastlearn
