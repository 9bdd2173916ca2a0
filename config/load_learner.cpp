#include <fastlearn/config/load_learner.h>

#include <fastlearn/callbacks/channels_last.h>
#include <fastlearn/core/detail/text.h>
#include <fastlearn/core/error.h>
#include <fastlearn/data/tabular_procs.h>
#include <fastlearn/learner/torchscript_loss.h>
#include <fastlearn/models/memory_format.h>
#include <fastlearn/models/torchscript.h>
#include <fastlearn/models/weights.h>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <nlohmann/json.hpp>

#include <set>
#include <sstream>

namespace fastlearn {

namespace {

// A TOML basic string (JSON's escapes are TOML's).
std::string quoted(const std::string& text) { return nlohmann::json(text).dump(); }

// The config the recipe describes, with what its checks need and an export does not hold: a data.path (the export
// itself, never read) and a table's target columns (from the pipeline).
TrainConfig recipe_config(const std::string& recipe, const InferencePipeline& pipeline, const std::string& origin) {
  const std::string header = "[data]\n";
  const auto at = recipe.find(header);
  if (at == std::string::npos)
    throw CheckpointError(fmt::format("{}: metadata 'model_recipe' has no [data] table", excerpt(origin, 256)));
  std::string extra;
  if (pipeline.kind == InferencePipeline::Kind::images || pipeline.kind == InferencePipeline::Kind::table)
    extra = fmt::format("path = {}\n", quoted(origin));
  const auto list = [](const std::vector<std::string>& names) {
    std::vector<std::string> out;
    for (const auto& name : names) out.push_back(quoted(name));
    return fmt::format("[{}]", fmt::join(out, ", "));
  };
  if (pipeline.masks()) extra += fmt::format("codes = {}\n", list(pipeline.vocab));
  if (pipeline.kind == InferencePipeline::Kind::table && !pipeline.table_layout.with_cont) {  // ratings
    const auto& columns = pipeline.procs->cat_columns();
    if (columns.size() != 2 || pipeline.y_names.size() != 1)
      throw CheckpointError(
          fmt::format("{}: a table of ratings has a user, an item and a rating column", excerpt(origin, 256)));
    extra += fmt::format("user = {}\nitem = {}\nrating = {}\n", quoted(columns[0]), quoted(columns[1]),
                         quoted(pipeline.y_names[0]));
  } else if (pipeline.kind == InferencePipeline::Kind::table) {
    extra += fmt::format("y_names = {}\ncat_names = {}\ncont_names = {}\n", list(pipeline.y_names),
                         list(pipeline.procs->cat_columns()), list(pipeline.procs->cont_names()));
  }
  auto text = recipe;
  text.insert(at + header.size(), extra);
  return parse_config(text, origin + ": model_recipe");
}

// The widths a built-in arch's recipe gives (its layers' sizes, and the outputs), each of which is a dimension of one
// of the file's tensors when the recipe describes them: checked before the model is built, so that a recipe cannot
// make load_learner allocate a model of any size it claims.
void check_widths(const TrainConfig& config, const InferencePipeline& pipeline, const NamedTensors& tensors,
                  const std::string& origin) {
  std::set<std::int64_t> sizes;
  for (const auto& [name, t] : tensors)
    if (t.numel() > 0)  // a tensor of no elements costs the file nothing, whatever sizes it claims
      for (const auto d : t.sizes()) sizes.insert(d);
  // A table's embeddings, one per categorical input, as many rows as its vocabulary: the file must hold each with that
  // shape (the vocabularies are the pipeline's, and the model allocates their rows before the weights are matched).
  const auto embedding = [&](const std::string& name, std::int64_t rows, std::int64_t width) {
    for (const auto& [tensor_name, t] : tensors)
      if (tensor_name == name && t.dim() == 2 && t.size(0) == rows && (width < 0 || t.size(1) == width)) return;
    throw CheckpointError(fmt::format(
        "{}: the model recipe and the pipeline describe the embedding '{}' of {} rows{}, which the file does not hold "
        "(the file was altered)",
        excerpt(origin, 256), name, rows, width < 0 ? "" : fmt::format(" of {}", width)));
  };
  if (pipeline.procs) {
    const auto& vocabs = pipeline.procs->vocabs();
    if (config.model.arch == "collab" && vocabs.size() == 2) {
      const auto users = static_cast<std::int64_t>(vocabs[0].size()),
                 items = static_cast<std::int64_t>(vocabs[1].size());
      embedding("u_weight.weight", users, config.model.n_factors);
      embedding("i_weight.weight", items, config.model.n_factors);
      embedding("u_bias.weight", users, 1);
      embedding("i_bias.weight", items, 1);
    } else if (config.model.arch == "collab_nn" || config.model.arch == "tabular") {
      for (std::size_t j = 0; j < vocabs.size(); ++j)
        embedding(fmt::format("embeds.{}.weight", j), static_cast<std::int64_t>(vocabs[j].size()), -1);
    }
  }
  const auto& m = config.model;
  std::vector<std::pair<std::string, std::int64_t>> claimed;
  const auto add = [&](const char* key, const std::vector<std::int64_t>& widths) {
    for (const auto w : widths) claimed.emplace_back(key, w);
  };
  const auto& d = config.data;
  if (d.dataset == "program") {
    std::vector<TensorInput> recipe;
    for (const auto& input : program_inputs(d)) recipe.push_back({.shape = input.shape, .dtype = input.dtype});
    if (recipe != pipeline.inputs)
      throw CheckpointError(fmt::format(
          "{}: the model recipe's inputs (data.input_shape or input_shapes, input_dtypes) are not the pipeline's "
          "(the file was altered)",
          excerpt(origin, 256)));
  }
  if (m.arch == "field_cnn")  // its outputs are channels of a field; its weights do not depend on the field's size
    claimed.emplace_back("data.target_shape's channels", d.target_shape.size() == 3 ? d.target_shape[0] : 1);
  else
    claimed.emplace_back("the outputs (c)", pipeline.c);
  if (m.arch == "mlp" || m.arch == "field_cnn") add("model.hidden", m.hidden);
  if (m.arch == "conv_net" || m.arch == "resnet") add("model.widths", m.widths);
  if (m.arch == "resnet") add("model.stem_width", {m.stem_width});
  if (m.arch == "tabular" || m.arch == "collab_nn") add("model.layers", m.layers);
  if (m.arch == "collab") add("model.n_factors", {m.n_factors});
  for (const auto& [key, width] : claimed)
    if (!sizes.contains(width))
      throw CheckpointError(fmt::format(
          "{}: the model recipe gives {} a size of {}, and no tensor of the file has that size: the recipe does not "
          "describe the weights (the file was altered)",
          excerpt(origin, 256), key, width));
}

Loss loss_named(const std::string& name, const TrainConfig& config, const std::string& origin) {
  std::vector<std::string> known;
  for (const auto& choice : loss_choices()) {
    if (choice.name == "torchscript") continue;  // its script is not in the export (loss_for_predictions)
    std::optional<Loss> loss;
    try {
      loss = choice.make(config);
    } catch (const std::exception&) {  // an entry that needs keys of [train], which a recipe does not hold
      continue;
    }
    if (loss->name == name) return *loss;
    known.push_back(loss->name);
  }
  throw ConfigError(fmt::format(
      "{}: the model was trained with the loss \"{}\", which is not one of the registry's (\"{}\"): give it as "
      "LoadLearnerOptions::loss, or add it with add_choice before loading",
      excerpt(origin, 256), excerpt(name), fmt::join(known, "\", \"")));
}

// A scripted loss's activation, which is all predictions need; the script itself is not in the export.
Loss loss_for_predictions(const ExportContents& contents, const std::string& origin) {
  Loss loss{.name = "torchscript"};
  set_activation(loss, contents.activation, excerpt(origin, 256));
  loss.fn_all = [origin = excerpt(origin, 256)](const std::vector<at::Tensor>&,
                                                const std::vector<at::Tensor>&) -> at::Tensor {
    throw ConfigError(fmt::format(
        "{}: the model was trained with a scripted loss, which an export does not carry (predictions need only its "
        "activation): give LoadLearnerOptions::loss = fl::torchscript_loss(FILE) to compute losses",
        origin));
  };
  return loss;
}

}  // namespace

std::string model_recipe(const TrainConfig& c) {
  std::string recipe = fmt::format("[data]\ndataset = {}\n", quoted(c.data.dataset));
  if (!c.data.y_block.empty()) recipe += fmt::format("y_block = {}\n", quoted(c.data.y_block));
  if (!c.data.label_delim.empty()) recipe += fmt::format("label_delim = {}\n", quoted(c.data.label_delim));
  if (c.data.dataset == "program") {
    const auto list = [](const std::vector<SampleTensor>& tensors, bool dtypes) {
      std::vector<std::string> items;
      for (const auto& t : tensors)
        items.push_back(dtypes ? quoted(t.dtype) : fmt::format("[{}]", fmt::join(t.shape, ", ")));
      return fmt::format("[{}]", fmt::join(items, ", "));
    };
    // One float32 input and target as every build wrote them; several, or integers, in the keys that say so.
    const auto inputs = program_inputs(c.data), targets = program_targets(c.data);
    if (inputs.size() == 1 && inputs[0].dtype == "float32")
      recipe += fmt::format("input_shape = [{}]\n", fmt::join(inputs[0].shape, ", "));
    else
      recipe += fmt::format("input_shapes = {}\ninput_dtypes = {}\n", list(inputs, false), list(inputs, true));
    if (c.data.classes > 0) recipe += fmt::format("classes = {}\n", c.data.classes);
    if (targets.size() == 1 && targets[0].dtype == (c.data.classes > 0 ? "int64" : "float32")) {
      if (!targets[0].shape.empty())  // a class per sample: the default
        recipe += fmt::format("target_shape = [{}]\n", fmt::join(targets[0].shape, ", "));
    } else
      recipe += fmt::format("target_shapes = {}\ntarget_dtypes = {}\n", list(targets, false), list(targets, true));
  }
  // The [model] table as the resolved config writes it, without the pretrained weights (the export holds them all).
  std::istringstream resolved(to_toml(c));
  bool in_model = false;
  for (std::string line; std::getline(resolved, line);) {
    if (line.starts_with("[")) in_model = line == "[model]";
    if (in_model && !line.empty() && !line.starts_with("weights ")) recipe += line + "\n";
  }
  return recipe;
}

std::unique_ptr<Learner> load_learner(const std::filesystem::path& file, const LoadLearnerOptions& options) {
  return load_learner(read_export(file), file, options);
}

std::unique_ptr<Learner> load_learner(const ExportContents& contents, const std::filesystem::path& file,
                                      const LoadLearnerOptions& options) {
  const auto origin = file.string();
  auto dls = inference_dataloaders(contents.pipeline, {.bs = options.bs, .num_workers = options.num_workers});
  TrainConfig config;
  BuiltModel model;
  if (options.model) {
    model = options.model(dls);
  } else if (!contents.torchscript.empty()) {  // the script and its tensors are in the file: no recipe needed
    auto script = std::make_shared<models::TorchScriptImpl>(
        contents.torchscript, excerpt(origin, 256) + " (its TorchScript model)", &contents.weights.tensors);
    model.module = script;
    model.forward = [script](const std::vector<at::Tensor>& xb) { return script->forward(xb); };
    model.replicate = detail::replicate_of<models::TorchScript>();
  } else if (contents.model_recipe.empty()) {
    throw CheckpointError(fmt::format(
        "{}: the model is one of your own (the export has no model_recipe): give LoadLearnerOptions::model, a "
        "factory that builds it from the data's description",
        excerpt(origin, 256)));
  }
  if (!contents.model_recipe.empty()) {
    config = recipe_config(contents.model_recipe, contents.pipeline, origin);
    if (!options.model && contents.torchscript.empty()) {
      check_widths(config, contents.pipeline, contents.weights.tensors, origin);
      const auto arch = find_arch(config);
      model = arch.make(config, dls);
    }
  }
  if (!model.module || !model.forward)
    throw ConfigError(
        fmt::format("load_learner({}): LoadLearnerOptions::model gave no module or no forward", excerpt(origin, 256)));
  auto loss = options.loss                     ? *options.loss
              : contents.loss == "torchscript" ? loss_for_predictions(contents, origin)
                                               : loss_named(contents.loss, config, origin);
  LearnerOptions learner_options{.progress = false, .device = options.device, .replicate = std::move(model.replicate)};
  learner_options.model_recipe = contents.model_recipe;
  auto learn = std::make_unique<Learner>(std::move(dls), std::move(model.module), std::move(model.forward),
                                         std::move(loss), std::move(learner_options));
  // Checked as a whole before any tensor is copied: a name, shape or dtype that differs names the tensor.
  models::copy_weights(models::match_weights(learn->model(), contents.weights.tensors, origin, {.strict = true}));
  if (contents.channels_last) {  // the same memory format as in training, so the same kernels and values
    models::to_channels_last(learn->model());
    learn->add_cb(std::make_shared<ChannelsLast>());
  }
  learn->model().eval();
  return learn;
}

}  // namespace fastlearn
