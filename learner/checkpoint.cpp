#include <fastlearn/learner/checkpoint.h>

#include <fastlearn/core/detail/text.h>
#include <fastlearn/core/error.h>
#include <fastlearn/data/tabular_dataloaders.h>
#include <fastlearn/learner/learner.h>
#include <fastlearn/models/weights.h>

#include <ATen/Context.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/torch.h>
#include <nlohmann/json.hpp>

#include <map>
#include <set>

namespace fastlearn {

namespace {

constexpr std::string_view kFormat = "fastlearn-checkpoint";
constexpr std::string_view kFormatVersion = "1";
constexpr std::string_view kOptimizerPrefix = "optimizer/";
constexpr std::string_view kRngPrefix = "rng/";
constexpr std::string_view kStepsPrefix = "steps/held_out/";  // the step API's held-out samples

std::vector<at::Generator> rng_generators() {
  std::vector<at::Generator> gens{at::detail::getDefaultCPUGenerator()};
  if (torch::cuda::is_available()) {
    for (int i = 0; i < static_cast<int>(torch::cuda::device_count()); ++i) {
      gens.push_back(at::globalContext().defaultGenerator(at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(i))));
    }
  }
  return gens;
}

std::string rng_name(std::size_t i) {
  return std::string(kRngPrefix) + (i == 0 ? "cpu" : fmt::format("cuda{}", i - 1));
}
// A process's own state in a checkpoint of a job of several: rng/rank<r>/cpu, rng/rank<r>/cuda<i>.
std::string rng_name(std::size_t i, int rank) {
  return fmt::format("{}rank{}/{}", kRngPrefix, rank, i == 0 ? "cpu" : fmt::format("cuda{}", i - 1));
}

bool starts_with(std::string_view s, std::string_view prefix) { return s.substr(0, prefix.size()) == prefix; }

// This process's generator i in the file: its rank's own state when the file has one per rank (a checkpoint
// of a job of several), else the single one (a checkpoint of one process, or of rank 0 only).
std::string rng_name_in(const std::map<std::string, const at::Tensor*>& in_file, std::size_t i, int rank) {
  const auto own = rng_name(i, rank);
  return in_file.contains(own) ? own : rng_name(i);
}

std::int64_t metadata_int(const Metadata& meta, const std::string& key, std::string_view origin) {
  auto it = meta.find(key);
  if (it == meta.end()) throw CheckpointError(fmt::format("{}: the metadata has no '{}'", excerpt(origin, 256), key));
  try {
    std::size_t used = 0;
    const auto value = std::stoll(it->second, &used);
    if (used != it->second.size()) throw std::invalid_argument(it->second);
    return value;
  } catch (const std::exception&) {
    throw CheckpointError(
        fmt::format("{}: metadata '{}' is '{}', not an integer", excerpt(origin, 256), key, excerpt(it->second)));
  }
}

Optimizer& ensure_opt(Learner& learn) {
  if (!learn.has_opt()) learn.create_opt();
  return learn.opt();
}

// The class names saved with the model (metadata "vocab"; empty when the data had none).
std::vector<std::string> checkpoint_vocab(const CheckpointState& state, std::string_view origin) {
  const auto it = state.metadata.find("vocab");
  if (it == state.metadata.end()) return {};
  try {
    return nlohmann::json::parse(it->second).get<std::vector<std::string>>();
  } catch (const std::exception&) {
    throw CheckpointError(fmt::format("{}: metadata 'vocab' is not a JSON list of class names", excerpt(origin, 256)));
  }
}

}  // namespace

namespace {

// Sharded parameters, during a fit: a model tensor is read through Coordination::whole_model_tensor.
bool model_sharded(Learner& learn) {
  const auto& c = learn.coordination();
  return c.model_sharded && c.model_sharded() && c.whole_model_tensor;
}

}  // namespace

bool saving_is_collective(Learner& learn, SaveOptions options) {
  return (options.with_opt && learn.has_opt() && learn.opt().sharded()) || model_sharded(learn);
}

namespace {

// Sharded parameters: the model's tensors each made whole when the writer reaches it, a unit at a time (collective).
std::vector<DeferredTensor> deferred_model_tensors(Learner& learn) {
  std::vector<DeferredTensor> out;
  for (auto& [name, tensor] : models::model_tensors(learn.model())) {
    out.push_back(
        {.name = name, .dtype = tensor.scalar_type(), .shape = tensor.sizes().vec(), .make = [&learn, t = tensor] {
           return learn.coordination().whole_model_tensor(t);
         }});
  }
  return out;
}

}  // namespace

namespace {

// `for_saving`: written at once (the model's tensors are not copied), a sharded optimizer's state deferred to the
// writer, and on a process other than the main one nothing but that (its part of the gathers).
// `step_state`: the held-out samples of the step API (private to the Learner, given by its friend capture_state).
StateToSave capture(Learner& learn, SaveOptions options, bool for_saving, const NamedTensors& step_state) {
  // A sharded optimizer's state is gathered from every process: a process calling alone fails within moments,
  // instead of waiting for the others in the gather until the collective timeout.
  const bool collective = saving_is_collective(learn, options);
  const bool params_sharded = model_sharded(learn);
  const bool opt_sharded = options.with_opt && learn.has_opt() && learn.opt().sharded();
  if (collective && learn.coordination().enter_collective)
    learn.coordination().enter_collective(params_sharded
                                              ? "saving a checkpoint (the sharded parameters are gathered)"
                                              : "saving a checkpoint (the sharded optimizer's state is gathered)");
  StateToSave out;
  if (for_saving && collective && !learn.coordination().is_main()) {
    if (params_sharded) out.deferred = deferred_model_tensors(learn);
    if (opt_sharded) {
      auto state = learn.opt().deferred_state_tensors();
      out.deferred.insert(out.deferred.end(), state.begin(), state.end());
    }
    return out;
  }
  auto& state = out.state;
  if (params_sharded && for_saving) {
    out.deferred_at = 0;  // the model's tensors come first in the file, the optimizer's state next
    out.deferred = deferred_model_tensors(learn);
  } else {
    for (auto& [name, t] : models::model_tensors(learn.model())) {
      const auto whole = params_sharded ? learn.coordination().whole_model_tensor(t) : t;
      state.tensors.emplace_back(name, for_saving ? whole.detach() : whole.detach().clone());
    }
  }
  state.metadata["format"] = kFormat;
  state.metadata["format_version"] = kFormatVersion;
  // The class names, so that predictions from the saved model map back to them.
  if (!learn.dls().vocab().empty()) {
    state.metadata["vocab"] = nlohmann::json(learn.dls().vocab()).dump();
    // Whether each item had one class or several: the same names, trained with another loss and activation.
    state.metadata["multi_label"] = learn.dls().multi_label() ? "true" : "false";
  }
  // A table's procs (vocabularies, fill values, statistics), which its rows must go through at predict time.
  if (const auto* table = tabular_dataset(learn.dls())) state.metadata["tabular_procs"] = table->procs().to_json();
  if (!options.with_opt) return out;
  if (learn.has_opt()) {
    if (for_saving && learn.opt().sharded()) {
      out.deferred_at = state.tensors.size();
      auto deferred = learn.opt().deferred_state_tensors();
      for (auto& d : deferred) d.name = std::string(kOptimizerPrefix) + d.name;
      out.deferred.insert(out.deferred.end(), deferred.begin(), deferred.end());
    } else {
      for (auto& [name, t] : learn.opt().state_tensors())
        state.tensors.emplace_back(std::string(kOptimizerPrefix) + name, t.detach().clone());
    }
    state.metadata["optimizer"] = learn.opt().state_json();
  }
  const auto gens = rng_generators();
  for (std::size_t i = 0; i < gens.size(); ++i) state.tensors.emplace_back(rng_name(i), gens[i].get_state());
  for (auto& [name, t] : step_state) state.tensors.emplace_back(std::string(kStepsPrefix) + name, t);
  state.metadata["epochs_completed"] = std::to_string(learn.epochs_completed());
  state.metadata["train_dl_epoch"] = std::to_string(learn.dls().train().epoch());
  state.metadata["train_dl_seed"] = std::to_string(learn.dls().train().seed());
  return out;
}

}  // namespace

CheckpointState capture_state(Learner& learn, SaveOptions options) {
  return capture(learn, options, /*for_saving=*/false, learn.step_state()).state;
}

StateToSave capture_state_to_save(Learner& learn, SaveOptions options) {
  return capture(learn, options, /*for_saving=*/true, learn.step_state());
}

void write_checkpoint(Learner& learn, const std::filesystem::path& file, const StateToSave& to_save) {
  const bool main = learn.coordination().is_main();
  if (main && file.has_parent_path()) std::filesystem::create_directories(file.parent_path());
  // The file's order is the unsharded one's: the deferred tensors where capture_state would have put them.
  std::vector<DeferredTensor> all;
  const auto& eager = to_save.state.tensors;
  const auto at_once = [&](std::size_t k) {
    const auto& tensor = eager[k].second;
    all.push_back(
        {.name = eager[k].first, .dtype = tensor.scalar_type(), .shape = tensor.sizes().vec(), .make = [tensor] {
           return tensor;
         }});
  };
  for (std::size_t k = 0; k < std::min(to_save.deferred_at, eager.size()); ++k) at_once(k);
  all.insert(all.end(), to_save.deferred.begin(), to_save.deferred.end());
  for (std::size_t k = to_save.deferred_at; k < eager.size(); ++k) at_once(k);
  save_checked_safetensors(file, all, to_save.state.metadata, main);
}

FitPosition current_fit_position(const Learner& learn, bool epoch_end) {
  FitPosition p{.n_epoch = learn.n_epoch,
                .epoch = learn.epoch,
                .batch = learn.iter + 1,
                .train_iter = learn.train_iter,
                .pct_train = learn.pct_train,
                .phase = learn.phase,
                .epoch_offset = learn.epoch_offset};
  if (epoch_end) {
    p.epoch = learn.epoch + 1;
    p.batch = 0;
  }
  if (auto rec = learn.cb<Recorder>()) {
    p.recorder = rec->epoch_state();
    if (epoch_end) p.recorder.loss_sum = 0, p.recorder.loss_count = 0;
  }
  return p;
}

void set_fit_position(CheckpointState& state, const FitPosition& p) {
  // nlohmann writes doubles with enough digits to read back the same bits.
  nlohmann::ordered_json j{{"n_epoch", p.n_epoch},
                           {"epoch", p.epoch},
                           {"batch", p.batch},
                           {"train_iter", p.train_iter},
                           {"pct_train", p.pct_train},
                           {"loss_sum", p.recorder.loss_sum},
                           {"loss_count", p.recorder.loss_count},
                           {"smooth_count", p.recorder.smooth_count},
                           {"smooth_average", p.recorder.smooth_average},
                           {"phase", p.phase},
                           {"epoch_offset", p.epoch_offset}};
  state.metadata["fit_position"] = j.dump();
  // The data order of the epoch to continue (a DataLoader advances its epoch when an epoch starts).
  if (p.batch > 0) {
    state.metadata["train_dl_epoch"] = std::to_string(std::stoll(state.metadata.at("train_dl_epoch")) - 1);
  }
}

std::optional<FitPosition> fit_position(const CheckpointState& state, std::string_view origin) {
  auto it = state.metadata.find("fit_position");
  if (it == state.metadata.end()) return std::nullopt;
  try {
    const auto j = nlohmann::json::parse(it->second);
    FitPosition p;
    p.n_epoch = j.at("n_epoch").get<int>();
    p.epoch = j.at("epoch").get<int>();
    p.batch = j.at("batch").get<std::int64_t>();
    p.train_iter = j.at("train_iter").get<std::int64_t>();
    p.pct_train = j.at("pct_train").get<double>();
    p.recorder.loss_sum = j.at("loss_sum").get<double>();
    p.recorder.loss_count = j.at("loss_count").get<std::int64_t>();
    p.recorder.smooth_count = j.at("smooth_count").get<std::int64_t>();
    p.recorder.smooth_average = j.at("smooth_average").get<double>();
    // Checkpoints of builds before fine_tune recorded its phases have neither: a plain fit.
    p.phase = j.value("phase", std::string());
    p.epoch_offset = j.value("epoch_offset", 0);
    if (p.n_epoch < 0 || p.epoch_offset < 0 || p.epoch < 0 || p.epoch > p.n_epoch || p.batch < 0 || p.train_iter < 0) {
      throw std::out_of_range("a value is out of range");
    }
    return p;
  } catch (const std::exception& e) {
    throw CheckpointError(fmt::format("{}: metadata 'fit_position' is malformed ({}): {}", excerpt(origin, 256),
                                      excerpt(e.what(), 256), excerpt(it->second)));
  }
}

void restore_state(Learner& learn, const CheckpointState& state, LoadOptions options, std::string_view origin) {
  if (model_sharded(learn))
    throw CheckpointError(fmt::format(
        "{}: cannot load into a model whose parameters are sharded over the processes (shard = \"parameters\", "
        "during a fit after its first training batch); load before the fit (resume_from) or after it",
        excerpt(origin, 256)));
  if (auto it = state.metadata.find("format"); it != state.metadata.end() && it->second != kFormat) {
    throw CheckpointError(
        fmt::format("{}: format '{}' is not a fastlearn checkpoint", excerpt(origin, 256), excerpt(it->second)));
  }
  if (auto it = state.metadata.find("format_version"); it != state.metadata.end() && it->second != kFormatVersion) {
    throw CheckpointError(fmt::format("{}: checkpoint format version {} is not supported (this build reads {})",
                                      excerpt(origin, 256), excerpt(it->second), kFormatVersion));
  }
  std::map<std::string, const at::Tensor*> in_file;
  for (const auto& [name, t] : state.tensors) in_file[name] = &t;

  if (auto it = state.metadata.find("vocab"); it != state.metadata.end() && !learn.dls().vocab().empty()) {
    const auto saved = checkpoint_vocab(state, origin);
    if (saved != learn.dls().vocab()) {
      throw CheckpointError(fmt::format("{}: the model was saved for the classes [{}], the data has [{}]",
                                        excerpt(origin, 256), fmt::join(excerpts(saved), ", "),
                                        fmt::join(excerpts(learn.dls().vocab()), ", ")));
    }
    if (auto multi = state.metadata.find("multi_label");
        multi != state.metadata.end() && (multi->second == "true") != learn.dls().multi_label()) {
      const auto kind = [](bool m) { return m ? "multi-label (several classes per item)" : "single-label"; };
      throw CheckpointError(fmt::format("{}: the model was trained on {} data; this data is {}", excerpt(origin, 256),
                                        kind(multi->second == "true"), kind(learn.dls().multi_label())));
    }
  }
  if (auto it = state.metadata.find("tabular_procs"); it != state.metadata.end()) {
    if (const auto* table = tabular_dataset(learn.dls())) {
      const auto saved = TabularProcs::from_json(it->second, std::string(origin));
      if (!(saved == table->procs())) {
        throw CheckpointError(
            fmt::format("{}: the model was saved with other tabular procs (columns, vocabularies "
                        "or statistics) than the data's: it was trained on other data",
                        excerpt(origin, 256)));
      }
    }
  }
  // 1. Check every model tensor before changing anything.
  const auto copies = models::match_weights(
      learn.model(), state.tensors, origin,
      {.strict = options.strict,
       .ignore_prefixes = {std::string(kOptimizerPrefix), std::string(kRngPrefix), std::string(kStepsPrefix)}});
  // The step API's held-out samples: every tensor with the same number of rows.
  NamedTensors held_out;
  for (const auto& [name, t] : state.tensors)
    if (starts_with(name, kStepsPrefix)) held_out.emplace_back(name.substr(kStepsPrefix.size()), t);
  for (const auto& [name, t] : held_out)
    if (t.dim() == 0 || t.size(0) != held_out.front().second.size(0) ||
        !(name.starts_with("input") || name.starts_with("target")))
      throw CheckpointError(fmt::format("{}: tensor '{}{}' is not one of the held-out samples' (rows of {})",
                                        excerpt(origin, 256), kStepsPrefix, name, held_out.front().second.size(0)));

  // 2. The optimizer and training position, if wanted and present (load_state checks before it changes).
  const bool restore_training = options.with_opt && state.metadata.contains("epochs_completed");
  int epochs_completed = 0;
  std::int64_t train_dl_epoch = 0;
  std::optional<std::uint64_t> train_dl_seed;
  if (restore_training) {
    epochs_completed = static_cast<int>(metadata_int(state.metadata, "epochs_completed", origin));
    train_dl_epoch = metadata_int(state.metadata, "train_dl_epoch", origin);
    if (auto it = state.metadata.find("train_dl_seed"); it != state.metadata.end()) {
      try {
        std::size_t used = 0;
        train_dl_seed = std::stoull(it->second, &used);
        if (used != it->second.size()) throw std::invalid_argument(it->second);
      } catch (const std::exception&) {
        throw CheckpointError(fmt::format("{}: metadata 'train_dl_seed' is '{}', not an unsigned integer",
                                          excerpt(origin, 256), excerpt(it->second)));
      }
    }
    // RNG states are checked here too, so that setting them below cannot fail.
    const auto gens = rng_generators();
    for (std::size_t i = 0; i < gens.size(); ++i) {
      auto it = in_file.find(rng_name_in(in_file, i, learn.coordination().rank));
      if (it == in_file.end()) continue;
      const auto expected = gens[i].get_state();
      if (it->second->scalar_type() != at::kByte || it->second->numel() != expected.numel()) {
        throw CheckpointError(fmt::format("{}: tensor '{}' is {} of {} elements but a generator state is Byte of {}",
                                          excerpt(origin, 256), it->first, c10::toString(it->second->scalar_type()),
                                          it->second->numel(), expected.numel()));
      }
    }
  }
  if (options.with_opt && state.metadata.contains("optimizer")) {
    NamedTensors opt_tensors;
    for (const auto& [name, t] : state.tensors) {
      if (starts_with(name, kOptimizerPrefix)) opt_tensors.emplace_back(name.substr(kOptimizerPrefix.size()), t);
    }
    const bool had_opt = learn.has_opt();
    try {
      ensure_opt(learn).load_state(opt_tensors, state.metadata.at("optimizer"));
    } catch (const CheckpointError& e) {
      if (!had_opt) learn.drop_opt();  // leave the learner as it was
      throw CheckpointError(fmt::format("{}: optimizer state: {}", excerpt(origin, 256), e.what()));
    }
  }

  // 3. Nothing can fail from here on.
  models::copy_weights(copies);
  if (restore_training) {
    const auto gens = rng_generators();
    for (std::size_t i = 0; i < gens.size(); ++i) {
      if (auto it = in_file.find(rng_name_in(in_file, i, learn.coordination().rank)); it != in_file.end()) {
        auto gen = gens[i];
        gen.set_state(*it->second);
      }
    }
    learn.restore_step_state(held_out);
    learn.set_epochs_completed(epochs_completed);
    learn.dls().train().set_epoch(train_dl_epoch);
    if (train_dl_seed) learn.dls().train().set_seed(*train_dl_seed);
  }
}

void save_checkpoint(Learner& learn, const std::filesystem::path& file, SaveOptions options) {
  write_checkpoint(learn, file, capture_state_to_save(learn, options));
}

void load_checkpoint(Learner& learn, const std::filesystem::path& file, LoadOptions options) {
  if (!std::filesystem::exists(file)) {
    throw CheckpointError(fmt::format("checkpoint '{}' does not exist", excerpt(file.string(), 256)));
  }
  restore_state(learn, load_safetensors(file), options, file.string());
}

at::Tensor gather_rng_states(Learner& learn) {
  std::vector<at::Tensor> parts;
  for (const auto& gen : rng_generators()) parts.push_back(gen.get_state().reshape({-1}));
  auto mine = at::cat(parts);
  const auto& gather = learn.coordination().all_gather_rows;
  return gather ? gather(mine) : mine.unsqueeze(0);
}

void add_rng_states_of_every_rank(CheckpointState& state, const at::Tensor& gathered) {
  const auto gens = rng_generators();
  for (std::int64_t r = 0; r < gathered.size(0); ++r) {
    std::int64_t offset = 0;
    for (std::size_t i = 0; i < gens.size(); ++i) {
      const auto n = gens[i].get_state().numel();
      state.tensors.emplace_back(rng_name(i, static_cast<int>(r)), gathered[r].narrow(0, offset, n).clone());
      offset += n;
    }
  }
}

// --- the Learner's checkpoint members ------------------------------------------------------------

std::filesystem::path Learner::checkpoint_path(const std::string& name) const {
  return options_.path / options_.model_dir / (name + ".safetensors");
}

std::filesystem::path Learner::save(const std::string& name, SaveOptions options) {
  const auto file = checkpoint_path(name);
  // No collective unless the optimizer is sharded: rank 0 may call it alone.
  if (coordination_.is_main() || saving_is_collective(*this, options)) save_checkpoint(*this, file, options);
  return file;
}

void Learner::load(const std::string& name, LoadOptions options) {
  if (coordination_.barrier) coordination_.barrier();  // a save() that rank 0 called before is complete
  load_checkpoint(*this, checkpoint_path(name), options);
}

int Learner::load_resume_point(const std::filesystem::path& file, int n_epoch_) {
  if (coordination_.barrier) coordination_.barrier();  // a checkpoint being written is complete first
  if (!std::filesystem::exists(file)) {
    throw CheckpointError(fmt::format("resume: checkpoint '{}' does not exist", excerpt(file.string(), 256)));
  }
  const auto state = load_safetensors(file);
  const auto position = fit_position(state, file.string());
  const auto part = [](const std::string& p) {
    return p.empty() ? std::string("a plain fit") : fmt::format("the '{}' fit of a fine_tune", excerpt(p));
  };
  if (position && position->phase != phase) {
    throw ConfigError(
        fmt::format("resume: checkpoint '{}' was taken in {} but this fit is {}; resume with the same "
                    "schedule (train.schedule){}",
                    excerpt(file.string(), 256), part(position->phase), part(phase),
                    position->phase.empty() ? " (a fine_tune checkpoint written before fastlearn recorded its phases "
                                              "reads as a plain fit's: start that fine_tune over)"
                                            : ""));
  }
  if (position && position->epoch_offset != epoch_offset) {
    throw ConfigError(
        fmt::format("resume: checkpoint '{}' was taken in a fit that followed {} epoch(s) but this fit follows {}; "
                    "resume with the same number of frozen epochs (freeze_epochs)",
                    excerpt(file.string(), 256), position->epoch_offset, epoch_offset));
  }
  if (position && position->n_epoch != n_epoch_) {
    throw ConfigError(
        fmt::format("resume: checkpoint '{}' was taken in a fit of {} epochs but this fit has {}; "
                    "resume with the same number of epochs (the schedules depend on it)",
                    excerpt(file.string(), 256), position->n_epoch, n_epoch_));
  }
  restore_state(*this, state, {}, file.string());
  if (!position) return std::clamp(epochs_completed_, 0, n_epoch_);
  resume_ = position;
  return position->epoch;
}

}  // namespace fastlearn
