// The C interface (c/fastlearn.h) over the step API: each handle owns a Learner built from a config (or an export)
// and, once the program sets it up, the data parallel scope around it. Every entry point runs its body inside
// `guarded`, which turns any exception into a status and the calling thread's last error.
#include <fastlearn/c/fastlearn.h>

#include <fastlearn/callbacks/checkpointing.h>
#include <fastlearn/comm/runtime.h>
#include <fastlearn/config/learner_from_config.h>
#include <fastlearn/config/load_learner.h>
#include <fastlearn/core/build_info.h>
#include <fastlearn/core/detail/text.h>
#include <fastlearn/core/error.h>
#include <fastlearn/data/inference_pipeline.h>
#include <fastlearn/distributed/distrib_ctx.h>
#include <fastlearn/learner/checkpoint.h>
#include <fastlearn/learner/export.h>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/torch.h>

#include <algorithm>
#include <exception>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <unordered_set>
#include <vector>

namespace fl = fastlearn;
namespace fs = std::filesystem;

namespace {

thread_local std::string last_error;

// fl_array::reserved as the Fortran module's fl_array_of sets it for an array it cannot describe in place.
constexpr int32_t kNotContiguous = 1;

// An error of the interface's own checks, with its status.
struct CallError : std::runtime_error {
  CallError(fl_status s, const std::string& message) : std::runtime_error(message), status(s) {}
  fl_status status;
};

// What a handle holds while it is alive.
struct LearnerState {
  std::optional<fl::TrainConfig> config;  // none for a Learner loaded from an export
  std::unique_ptr<fl::Learner> learn;
  std::unique_ptr<fl::DistribCtx> job;  // fl_distributed_init_ranks: the whole job's process group
  fl::GroupPtr group;                   // and the subset's, which the learner trains over
  std::unique_ptr<fl::DistribCtx> distributed;
  std::vector<fl::SampleTensor> inputs;   // one sample's, in order
  std::vector<fl::SampleTensor> targets;  // empty for an export (the outputs are whatever the model gives)
  bool steps_begun = false;
  bool ended_by_program = false;  // fl_end_steps ended the steps, not their plan or a callback

  LearnerState() = default;
  LearnerState(const LearnerState&) = delete;
  LearnerState& operator=(const LearnerState&) = delete;
  ~LearnerState() {
    try {
      if (learn) learn->end_steps();
    } catch (...) {  // the steps' error was reported by the call that met it; freeing goes on
    }
    distributed.reset();  // detaches the Learner first: the scope refers to it
    group.reset();
    job.reset();
    learn.reset();
  }
};

}  // namespace

// A handle is never deleted: once freed it stays, empty, so that a later call with it (or with a copy of it) is told
// so instead of reading freed memory, and no new handle reuses its address. Freeing releases everything it held.
struct fl_learner {
  std::mutex mutex;  // one call at a time
  std::unique_ptr<LearnerState> state;
};

namespace {

std::mutex handles_mutex;
std::unordered_set<const fl_learner*>& handles() {
  static auto* all = new std::unordered_set<const fl_learner*>();  // every handle ever made; never destroyed
  return *all;
}

fl_status status_of(const std::exception& e) {
  if (const auto* call = dynamic_cast<const CallError*>(&e)) return call->status;
  if (dynamic_cast<const fl::ConfigError*>(&e)) return FL_ERROR_CONFIG;
  if (dynamic_cast<const fl::CheckpointError*>(&e) || dynamic_cast<const fl::DataError*>(&e)) return FL_ERROR_IO;
  if (dynamic_cast<const fl::DistributedError*>(&e)) return FL_ERROR_DISTRIBUTED;
  if (dynamic_cast<const fs::filesystem_error*>(&e)) return FL_ERROR_IO;
  return FL_ERROR_INTERNAL;
}

// Runs `body`, turning what it throws into a status and this thread's last error, prefixed with the function's name.
template <class Body>
fl_status guarded(const char* function, Body&& body) noexcept {
  try {
    last_error.clear();
    body();
    return FL_OK;
  } catch (const std::exception& e) {
    const auto status = status_of(e);
    try {
      std::string message = e.what();
      if (const auto* torch_error = dynamic_cast<const c10::Error*>(&e))
        message = torch_error->what_without_backtrace();
      last_error = std::string(function) + ": " + message;
    } catch (...) {
      last_error.clear();  // out of memory for the message itself
    }
    return status;
  } catch (...) {
    last_error = std::string(function) + ": an unknown error";
    return FL_ERROR_INTERNAL;
  }
}

// Runs `body` with the live state of `handle`, one call at a time.
template <class Body>
fl_status with_learner(const char* function, fl_learner* handle, Body&& body) noexcept {
  return guarded(function, [&] {
    if (handle == nullptr) throw CallError(FL_ERROR_NULL, "the learner is NULL");
    {
      const std::lock_guard lock(handles_mutex);
      if (!handles().contains(handle))
        throw CallError(FL_ERROR_STATE, "this is not a learner that fl_create or fl_load_export made");
    }
    const std::lock_guard lock(handle->mutex);
    if (!handle->state) throw CallError(FL_ERROR_STATE, "the learner was freed (fl_free)");
    body(*handle->state);
  });
}

const char* needed(const char* text, const char* what) {
  if (text == nullptr) throw CallError(FL_ERROR_NULL, fmt::format("{} is NULL", what));
  return text;
}

fl_learner* make_handle(std::unique_ptr<LearnerState> state) {
  auto* handle = new fl_learner();
  handle->state = std::move(state);
  const std::lock_guard lock(handles_mutex);
  handles().insert(handle);
  return handle;
}

std::string shape_text(const std::vector<std::int64_t>& shape) { return fmt::format("[{}]", fmt::join(shape, ", ")); }

const char* dtype_name(int32_t dtype) {
  switch (dtype) {
    case FL_FLOAT32:
      return "float32";
    case FL_FLOAT64:
      return "float64";
    case FL_INT32:
      return "int32";
    case FL_INT64:
      return "int64";
    default:
      return "?";
  }
}

// The array as the caller declared it, for messages: "(8, 32, 32) column-major float64".
std::string declared(const fl_array& a) {
  return fmt::format("({}) {} {}", fmt::join(std::vector<std::int64_t>(a.shape, a.shape + a.ndim), ", "),
                     a.layout == FL_COLUMN_MAJOR ? "column-major" : "row-major", dtype_name(a.dtype));
}

// What a shape error about a column-major array adds.
const char* reversed_hint(const fl_array& a) {
  return a.layout == FL_COLUMN_MAJOR ? " (a column-major array lists its dimensions in reverse, the batch last)" : "";
}

// The caller's array as a tensor over its memory, batch first: row-major as declared, column-major with the shape
// reversed (the same memory read in C order). Checked before anything is read.
at::Tensor view_of(const fl_array* a, const std::string& what) {
  if (a == nullptr) throw CallError(FL_ERROR_NULL, fmt::format("{} is NULL", what));
  if (a->dtype != FL_FLOAT32 && a->dtype != FL_FLOAT64 && a->dtype != FL_INT32 && a->dtype != FL_INT64)
    throw CallError(FL_ERROR_SHAPE,
                    fmt::format("{}: dtype {} is none of FL_FLOAT32 (0), FL_FLOAT64 (1), FL_INT32 (2), FL_INT64 (3)",
                                what, a->dtype));
  if (a->layout != FL_ROW_MAJOR && a->layout != FL_COLUMN_MAJOR)
    throw CallError(FL_ERROR_SHAPE,
                    fmt::format("{}: layout {} is neither FL_ROW_MAJOR (0) nor FL_COLUMN_MAJOR (1)", what, a->layout));
  if (a->ndim < 1 || a->ndim > FL_MAX_DIMS)
    throw CallError(FL_ERROR_SHAPE, fmt::format("{}: ndim {} is not in [1, {}]", what, a->ndim, FL_MAX_DIMS));
  std::vector<std::int64_t> sizes(a->shape, a->shape + a->ndim);
  std::int64_t elements = 1;
  for (const auto d : sizes) {
    if (d < 1) throw CallError(FL_ERROR_SHAPE, fmt::format("{}: shape {} has a dimension below 1", what, declared(*a)));
    if (d > (std::int64_t{1} << 40) / elements)
      throw CallError(FL_ERROR_SHAPE, fmt::format("{}: shape {} holds more than 2^40 values", what, declared(*a)));
    elements *= d;
  }
  if (a->reserved == kNotContiguous)
    throw CallError(FL_ERROR_SHAPE,
                    fmt::format("{}: the Fortran array is not contiguous (an array section with a stride, or a "
                                "non-contiguous pointer): hand fl_array_of a whole array, or a copy of the section",
                                what));
  if (a->data == nullptr) throw CallError(FL_ERROR_NULL, fmt::format("{}: data is NULL", what));
  if (a->layout == FL_COLUMN_MAJOR) std::reverse(sizes.begin(), sizes.end());
  const auto type = a->dtype == FL_FLOAT64 ? torch::kFloat64
                    : a->dtype == FL_INT32 ? torch::kInt32
                    : a->dtype == FL_INT64 ? torch::kInt64
                                           : torch::kFloat32;
  return torch::from_blob(a->data, sizes, type);
}

// A batch of samples as `sample` declares them (its shape; its dtype: float32 from a float64 array, int64 from an
// int32 one, no copy when the array has the dtype already), every float value finite. `key` names the declaration.
at::Tensor batch_of(const fl_array* a, const std::string& what, const fl::SampleTensor& sample, const char* key) {
  auto t = view_of(a, what);
  const auto sizes = t.sizes().vec();
  if (std::vector<std::int64_t>(sizes.begin() + 1, sizes.end()) != sample.shape)
    throw CallError(FL_ERROR_SHAPE, fmt::format("{}: {} is a batch of {} samples of shape {}, and {} is {}{}", what,
                                                declared(*a), sizes[0], shape_text({sizes.begin() + 1, sizes.end()}),
                                                key, shape_text(sample.shape), reversed_hint(*a)));
  const bool integer = a->dtype == FL_INT32 || a->dtype == FL_INT64;
  const auto wanted = sample.dtype == "int64"   ? torch::kInt64
                      : sample.dtype == "int32" ? torch::kInt32
                                                : torch::kFloat32;
  if (integer != (wanted != torch::kFloat32) || (wanted == torch::kInt32 && a->dtype == FL_INT64))
    throw CallError(
        FL_ERROR_SHAPE,
        fmt::format("{}: {} holds {} values, and it is declared {}{}", what, declared(*a), dtype_name(a->dtype),
                    sample.dtype,
                    integer ? " (give FL_FLOAT32 or FL_FLOAT64 values)"
                            : " (data.input_dtypes, data.target_dtypes: give FL_INT64 or FL_INT32 values)"));
  if (t.scalar_type() != wanted) t = t.to(wanted);
  if (integer) return t;
  const auto finite = torch::isfinite(t);
  if (!finite.all().item<bool>()) {
    const auto first = (~finite).flatten().nonzero()[0].item<std::int64_t>();
    throw CallError(FL_ERROR_VALUE, fmt::format("{}: element {} (0-based, in memory order) of {} is {}", what, first,
                                                declared(*a), t.flatten()[first].item<float>()));
  }
  return t;
}

// The batch sizes of inputs and targets agree.
void same_batch(const at::Tensor& inputs, const at::Tensor& targets) {
  if (inputs.size(0) != targets.size(0))
    throw CallError(FL_ERROR_SHAPE, fmt::format("inputs hold a batch of {} samples and targets one of {}",
                                                inputs.size(0), targets.size(0)));
}

void needs_config(const LearnerState& s, const char* what) {
  if (!s.config)
    throw CallError(FL_ERROR_STATE,
                    fmt::format("a learner loaded from an export predicts only; {} needs one from fl_create", what));
}

// The steps the config plans start with the first step (or hold_out, or resume).
void begin_steps(LearnerState& s, const fl::FitOptions& fit = {}) {
  if (s.steps_begun) return;
  s.learn->begin_steps(fl::step_plan(*s.config), fl::step_fit(*s.config, fit));
  s.steps_begun = true;
}

std::unique_ptr<LearnerState> state_of_config(fl::TrainConfig config, const std::string& origin) {
  if (config.data.dataset != "program")
    throw CallError(FL_ERROR_CONFIG,
                    fmt::format("{}: data.dataset is \"{}\"; a program's learner takes its samples from the program: "
                                "set data.dataset = \"program\" with data.input_shape and data.target_shape",
                                fl::excerpt(origin, 256), fl::excerpt(config.data.dataset)));
  fl::check_devices(config, fl::local_world_size(), origin);
  // The run's folder now, so that one that cannot be written is said here rather than at the first epoch's end.
  if (std::error_code ec; !fs::create_directories(config.output.dir, ec) && ec)
    throw CallError(FL_ERROR_IO, fmt::format("{}: output.dir '{}' cannot be created: {}", fl::excerpt(origin, 256),
                                             fl::excerpt(config.output.dir, 256), ec.message()));
  auto state = std::make_unique<LearnerState>();
  state->learn = fl::learner_from_config(config, {.progress = false, .checked = true});
  state->inputs = fl::program_inputs(config.data);
  state->targets = fl::program_targets(config.data);
  state->config = std::move(config);
  return state;
}

// The batch of `n` arrays as `declared` says, each named ("inputs", or "inputs[i]" when there are several or
// `indexed`); FL_ERROR_CONFIG when n is not the declared count; the batch sizes agree.
std::vector<at::Tensor> batches_of(int32_t n, const fl_array* arrays, const std::vector<fl::SampleTensor>& declared,
                                   const char* what, bool indexed) {
  const bool several = indexed || declared.size() > 1;
  const auto key =
      fmt::format("data.{}_shape{}", what == std::string("inputs") ? "input" : "target", several ? "s" : "");
  if (n != static_cast<int32_t>(declared.size()))
    throw CallError(FL_ERROR_CONFIG, fmt::format("{}: {} array(s) given, and the config declares {} ({})", what, n,
                                                 declared.size(), key));
  if (n > 0 && arrays == nullptr) throw CallError(FL_ERROR_NULL, fmt::format("{} is NULL", what));
  std::vector<at::Tensor> out;
  for (int32_t i = 0; i < n; ++i) {
    const auto name = indexed || n > 1 ? fmt::format("{}[{}]", what, i) : std::string(what);
    const auto declaration = several ? fmt::format("{}[{}]", key, i) : key;
    out.push_back(batch_of(&arrays[i], name, declared[static_cast<std::size_t>(i)], declaration.c_str()));
    if (out.back().size(0) != out.front().size(0))
      throw CallError(FL_ERROR_SHAPE, fmt::format("{} holds a batch of {} samples and {}[0] one of {}", name,
                                                  out.back().size(0), what, out.front().size(0)));
  }
  return out;
}

// data.classes: the first target's labels are classes, each in [0, classes) (checked here: out of range on a GPU,
// cross entropy would assert on the device).
void check_classes(const LearnerState& s, const at::Tensor& labels, bool several) {
  const auto classes = s.config->data.classes;
  if (classes <= 0 || labels.numel() == 0) return;
  const auto low = labels.min().item<std::int64_t>(), high = labels.max().item<std::int64_t>();
  if (low < 0 || high >= classes)
    throw CallError(FL_ERROR_VALUE,
                    fmt::format("{}: class {} is not in [0, {}) (data.classes = {})",
                                several ? "targets[0]" : "targets", low < 0 ? low : high, classes, classes));
}

void train_step(LearnerState& s, int32_t n_inputs, const fl_array* inputs, int32_t n_targets, const fl_array* targets,
                double* loss, bool indexed) {
  needs_config(s, "training");
  auto x = batches_of(n_inputs, inputs, s.inputs, "inputs", indexed);
  auto y = batches_of(n_targets, targets, s.targets, "targets", indexed);
  same_batch(x.front(), y.front());
  check_classes(s, y.front(), indexed || y.size() > 1);
  begin_steps(s);
  if (!s.learn->stepping()) {
    const auto trained = s.learn->train_iter;
    const auto planned = fl::step_plan(*s.config).steps;
    const char* why = trained == planned   ? ""
                      : s.ended_by_program ? " (fl_end_steps ended them)"
                                           : " (stopped by a callback)";
    throw CallError(FL_ERROR_STATE,
                    fmt::format("the steps have ended after {} of the {} planned{}", trained, planned, why));
  }
  const auto value = s.learn->train_step(std::move(x), std::move(y));
  // The step is done and nothing reads the caller's arrays again: the Learner keeps no view of them.
  s.learn->xb.clear();
  s.learn->yb.clear();
  if (loss != nullptr) *loss = value.defined() ? value.item<double>() : std::nan("");
}

void hold_out(LearnerState& s, int32_t n_inputs, const fl_array* inputs, int32_t n_targets, const fl_array* targets,
              bool indexed) {
  needs_config(s, "holding samples out");
  if (s.config->data.held_out == 0)
    throw CallError(FL_ERROR_CONFIG, "the config holds no samples out: set data.held_out to how many to keep");
  auto x = batches_of(n_inputs, inputs, s.inputs, "inputs", indexed);
  auto y = batches_of(n_targets, targets, s.targets, "targets", indexed);
  same_batch(x.front(), y.front());
  check_classes(s, y.front(), indexed || y.size() > 1);
  begin_steps(s);
  if (!s.learn->stepping()) throw CallError(FL_ERROR_STATE, "the steps have ended");
  s.learn->hold_out(x, y);  // copies the rows
}

void predict(LearnerState& s, int32_t n_inputs, const fl_array* inputs, int32_t n_outputs, fl_array* outputs,
             bool indexed) {
  auto x = batches_of(n_inputs, inputs, s.inputs, "inputs", indexed);
  if (n_outputs < 1 || outputs == nullptr)
    throw CallError(n_outputs < 1 ? FL_ERROR_CONFIG : FL_ERROR_NULL,
                    n_outputs < 1 ? fmt::format("outputs: {} array(s) given; at least one", n_outputs)
                                  : std::string("outputs is NULL"));
  std::vector<at::Tensor> views;  // checked, all of them, before any is written
  for (int32_t i = 0; i < n_outputs; ++i)
    views.push_back(view_of(&outputs[i], indexed || n_outputs > 1 ? fmt::format("outputs[{}]", i) : "outputs"));
  const auto preds = s.learn->predict_batch_outputs(std::move(x));
  if (static_cast<std::size_t>(n_outputs) != preds.size())
    throw CallError(FL_ERROR_SHAPE, fmt::format("outputs: {} array(s) given, and the model returns {} output(s)",
                                                n_outputs, preds.size()));
  for (std::size_t i = 0; i < preds.size(); ++i) {
    if (views[i].sizes() != preds[i].sizes())
      throw CallError(FL_ERROR_SHAPE,
                      fmt::format("{}: {} is read as {}, and the model's output for these inputs is {}{}",
                                  indexed || n_outputs > 1 ? fmt::format("outputs[{}]", i) : "outputs",
                                  declared(outputs[i]), shape_text(views[i].sizes().vec()),
                                  shape_text(preds[i].sizes().vec()), reversed_hint(outputs[i])));
  }
  for (std::size_t i = 0; i < preds.size(); ++i) views[i].copy_(preds[i]);
}

}  // namespace

extern "C" {

const char* fl_version(void) {
  static const std::string version = [] {
    try {
      return fl::build_info().fastlearn_version;
    } catch (...) {
      return std::string("?");
    }
  }();
  return version.c_str();
}

const char* fl_last_error(void) { return last_error.c_str(); }

fl_status fl_create(const char* config_file, fl_learner** learner) {
  return guarded("fl_create", [&] {
    if (learner == nullptr) throw CallError(FL_ERROR_NULL, "the learner pointer is NULL");
    *learner = nullptr;
    const std::string path = needed(config_file, "the config file");
    if (fs::is_directory(path))
      throw CallError(FL_ERROR_CONFIG, fmt::format("{}: is a folder, not a config file", fl::excerpt(path, 256)));
    *learner = make_handle(state_of_config(fl::load_config(path), path));
  });
}

fl_status fl_create_from_toml(const char* toml, const char* source_name, fl_learner** learner) {
  return guarded("fl_create_from_toml", [&] {
    if (learner == nullptr) throw CallError(FL_ERROR_NULL, "the learner pointer is NULL");
    *learner = nullptr;
    const std::string name = source_name != nullptr ? source_name : "config";
    *learner = make_handle(state_of_config(fl::parse_config(needed(toml, "the config text"), name), name));
  });
}

fl_status fl_load_export(const char* export_file, const char* device, fl_learner** learner) {
  return guarded("fl_load_export", [&] {
    if (learner == nullptr) throw CallError(FL_ERROR_NULL, "the learner pointer is NULL");
    *learner = nullptr;
    const std::string file = needed(export_file, "the export file");
    const std::string where = device != nullptr ? device : "auto";
    fl::LoadLearnerOptions options;
    if (where != "auto") {
      try {
        options.device = c10::Device(where);
      } catch (const std::exception&) {
        throw CallError(FL_ERROR_CONFIG, fmt::format("device \"{}\" is not \"auto\", \"cpu\", \"cuda\" or \"cuda:N\"",
                                                     fl::excerpt(where)));
      }
    }
    const auto contents = fl::read_export(file);
    using Kind = fl::InferencePipeline::Kind;
    if (const auto kind = contents.pipeline.kind; kind != Kind::tensors)
      throw CallError(FL_ERROR_CONFIG,
                      fmt::format("{}: the model reads {}; the C interface hands it arrays (an export of a learner "
                                  "trained on arrays, such as one of data.dataset = \"program\")",
                                  fl::excerpt(file, 256),
                                  kind == Kind::images  ? "image files"
                                  : kind == Kind::table ? "a table's rows"
                                                        : "data of its own, which the export does not describe"));
    auto state = std::make_unique<LearnerState>();
    state->learn = fl::load_learner(contents, file, options);
    for (const auto& input : contents.pipeline.inputs)
      state->inputs.push_back({.shape = input.shape, .dtype = input.dtype});
    *learner = make_handle(std::move(state));
  });
}

fl_status fl_free(fl_learner** learner) {
  return guarded("fl_free", [&] {
    if (learner == nullptr || *learner == nullptr) return;
    fl_learner* handle = std::exchange(*learner, nullptr);
    {
      const std::lock_guard lock(handles_mutex);
      if (!handles().contains(handle))
        throw CallError(FL_ERROR_STATE, "this is not a learner that fl_create or fl_load_export made");
    }
    std::unique_ptr<LearnerState> state;
    {
      const std::lock_guard lock(handle->mutex);
      if (!handle->state) throw CallError(FL_ERROR_STATE, "the learner was freed already");
      state = std::move(handle->state);
    }
    state.reset();
  });
}

fl_status fl_distributed_init(fl_learner* learner) {
  return with_learner("fl_distributed_init", learner, [&](LearnerState& s) {
    needs_config(s, "data parallel training");
    if (s.steps_begun)
      throw CallError(FL_ERROR_STATE, "the steps have begun; set up data parallel training before the first step");
    if (s.job) throw CallError(FL_ERROR_STATE, "data parallel training is set up already (fl_distributed_init_ranks)");
    if (s.distributed) return;
    const auto& d = s.config->distributed;
    s.distributed = std::make_unique<fl::DistribCtx>(*s.learn, fl::trainer_options(d), fl::setup_options(d));
  });
}

fl_status fl_distributed_init_ranks(fl_learner* learner, const int32_t* ranks, int32_t n) {
  return with_learner("fl_distributed_init_ranks", learner, [&](LearnerState& s) {
    needs_config(s, "data parallel training");
    if (s.steps_begun)
      throw CallError(FL_ERROR_STATE, "the steps have begun; set up data parallel training before the first step");
    if (s.distributed || s.job)
      throw CallError(FL_ERROR_STATE, "data parallel training is set up already (fl_distributed_init)");
    if (n < 1 || ranks == nullptr)
      throw CallError(n < 1 ? FL_ERROR_CONFIG : FL_ERROR_NULL,
                      n < 1 ? fmt::format("{} ranks given; at least one", n) : std::string("ranks is NULL"));
    const auto& d = s.config->distributed;
    const int world = fl::is_initialized() ? fl::world_size() : fl::dist_env().world_size;  // checked before setup
    std::vector<int> members(ranks, ranks + n);
    std::sort(members.begin(), members.end());
    for (std::size_t i = 0; i < members.size(); ++i) {
      if (members[i] < 0 || members[i] >= world || (i > 0 && members[i] == members[i - 1]))
        throw CallError(
            FL_ERROR_CONFIG,
            fmt::format("ranks [{}]: {} {} of a job of {} process(es) (ranks 0 to {})",
                        fmt::join(std::vector<int>(ranks, ranks + n), ", "), members[i],
                        members[i] < 0 || members[i] >= world ? "is not a rank" : "is listed twice", world, world - 1));
    }
    auto job = std::make_unique<fl::DistribCtx>(fl::setup_options(d));  // the whole job's group, if it has several
    if (!job->active()) {                                               // a job of one process: rank 0 trains alone
      s.job = std::move(job);
      return;
    }
    auto group = fl::new_group(members);  // collective over the whole job, members or not
    if (group->is_member()) {
      auto options = fl::trainer_options(d);
      options.group = group.get();
      s.distributed = std::make_unique<fl::DistribCtx>(*s.learn, options, fl::setup_options(d));
    }
    s.group = std::move(group);
    s.job = std::move(job);
  });
}

fl_status fl_rank(fl_learner* learner, int32_t* rank, int32_t* world_size) {
  return with_learner("fl_rank", learner, [&](LearnerState& s) {
    const bool subset = s.group != nullptr;
    if (rank != nullptr) *rank = subset ? s.group->rank() : fl::rank();
    if (world_size != nullptr) *world_size = subset ? s.group->size() : fl::world_size();
  });
}

fl_status fl_global_rank(fl_learner* learner, int32_t* rank, int32_t* world_size) {
  return with_learner("fl_global_rank", learner, [&](LearnerState&) {
    if (rank != nullptr) *rank = fl::rank();
    if (world_size != nullptr) *world_size = fl::world_size();
  });
}

fl_status fl_train_step(fl_learner* learner, const fl_array* inputs, const fl_array* targets, double* loss) {
  return with_learner("fl_train_step", learner,
                      [&](LearnerState& s) { train_step(s, 1, inputs, 1, targets, loss, /*indexed=*/false); });
}

fl_status fl_train_step_n(fl_learner* learner, int32_t n_inputs, const fl_array* inputs, int32_t n_targets,
                          const fl_array* targets, double* loss) {
  return with_learner("fl_train_step_n", learner, [&](LearnerState& s) {
    train_step(s, n_inputs, inputs, n_targets, targets, loss, /*indexed=*/true);
  });
}

fl_status fl_hold_out(fl_learner* learner, const fl_array* inputs, const fl_array* targets) {
  return with_learner("fl_hold_out", learner,
                      [&](LearnerState& s) { hold_out(s, 1, inputs, 1, targets, /*indexed=*/false); });
}

fl_status fl_hold_out_n(fl_learner* learner, int32_t n_inputs, const fl_array* inputs, int32_t n_targets,
                        const fl_array* targets) {
  return with_learner("fl_hold_out_n", learner,
                      [&](LearnerState& s) { hold_out(s, n_inputs, inputs, n_targets, targets, /*indexed=*/true); });
}

fl_status fl_predict(fl_learner* learner, const fl_array* inputs, fl_array* outputs) {
  return with_learner("fl_predict", learner,
                      [&](LearnerState& s) { predict(s, 1, inputs, 1, outputs, /*indexed=*/false); });
}

fl_status fl_predict_n(fl_learner* learner, int32_t n_inputs, const fl_array* inputs, int32_t n_outputs,
                       fl_array* outputs) {
  return with_learner("fl_predict_n", learner,
                      [&](LearnerState& s) { predict(s, n_inputs, inputs, n_outputs, outputs, /*indexed=*/true); });
}

fl_status fl_end_steps(fl_learner* learner) {
  return with_learner("fl_end_steps", learner, [&](LearnerState& s) {
    if (s.learn->stepping()) s.ended_by_program = true;
    s.learn->end_steps();
  });
}

fl_status fl_steps(fl_learner* learner, int64_t* trained, int64_t* planned, int32_t* running) {
  return with_learner("fl_steps", learner, [&](LearnerState& s) {
    if (trained != nullptr) *trained = s.steps_begun ? s.learn->train_iter : 0;
    if (planned != nullptr) *planned = s.config ? fl::step_plan(*s.config).steps : 0;
    if (running != nullptr) *running = s.config && (!s.steps_begun || s.learn->stepping()) ? 1 : 0;
  });
}

fl_status fl_resume(fl_learner* learner, const char* checkpoint) {
  return with_learner("fl_resume", learner, [&](LearnerState& s) {
    needs_config(s, "resuming");
    fs::path file = needed(checkpoint, "the checkpoint");
    if (s.steps_begun)
      throw CallError(FL_ERROR_STATE, "the steps have begun; resume before the first step (and fl_hold_out)");
    if (fs::is_directory(file)) {
      const auto latest = fl::latest_checkpoint(file);
      if (!latest)
        throw CallError(FL_ERROR_IO, fmt::format("'{}' holds no complete checkpoint", fl::excerpt(file.string(), 256)));
      file = *latest;
    } else if (!fs::exists(file)) {
      throw CallError(FL_ERROR_IO, fmt::format("'{}' does not exist", fl::excerpt(file.string(), 256)));
    }
    begin_steps(s, {.resume_from = file});
  });
}

fl_status fl_save(fl_learner* learner, const char* file) {
  return with_learner("fl_save", learner, [&](LearnerState& s) {
    const fs::path path = needed(file, "the file");
    if (s.learn->coordination().is_main() || fl::saving_is_collective(*s.learn)) fl::save_checkpoint(*s.learn, path);
  });
}

fl_status fl_load(fl_learner* learner, const char* file) {
  return with_learner("fl_load", learner, [&](LearnerState& s) {
    const fs::path path = needed(file, "the file");
    if (s.learn->stepping()) throw CallError(FL_ERROR_STATE, "steps are under way; fl_end_steps first");
    fl::load_checkpoint(*s.learn, path);
  });
}

fl_status fl_export(fl_learner* learner, const char* file) {
  return with_learner("fl_export", learner, [&](LearnerState& s) { s.learn->export_to(needed(file, "the file")); });
}

}  // extern "C"
