#include <fastlearn/models/weights.h>

#include <fastlearn/core/detail/text.h>
#include <fastlearn/core/error.h>
#include <fastlearn/core/safetensors.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/torch.h>

#include <map>
#include <set>

namespace fastlearn::models {

NamedTensors model_tensors(torch::nn::Module& model) {
  NamedTensors out;
  for (const auto& item : model.named_parameters(true)) out.emplace_back(item.key(), item.value());
  for (const auto& item : model.named_buffers(true)) out.emplace_back(item.key(), item.value());
  return out;
}

std::vector<std::pair<at::Tensor, const at::Tensor*>> match_weights(torch::nn::Module& model,
                                                                    const NamedTensors& tensors,
                                                                    std::string_view origin,
                                                                    const WeightsOptions& options) {
  std::map<std::string, const at::Tensor*> in_file;
  for (const auto& [name, t] : tensors) in_file[name] = &t;
  std::set<std::string> model_names;
  std::vector<std::pair<at::Tensor, const at::Tensor*>> copies;
  for (auto& [name, target] : model_tensors(model)) {
    model_names.insert(name);
    auto it = in_file.find(name);
    if (it == in_file.end()) {
      if (!options.strict) continue;
      throw CheckpointError(
          fmt::format("{}: no tensor '{}', which the model has; the file was saved from another "
                      "model (load with strict = false to load the tensors that match)",
                      excerpt(origin, 256), excerpt(name)));
    }
    const auto& source = *it->second;
    if (source.sizes() != target.sizes()) {
      throw CheckpointError(fmt::format("{}: tensor '{}' has shape [{}] in the file but [{}] in the model",
                                        excerpt(origin, 256), excerpt(name), fmt::join(source.sizes(), ", "),
                                        fmt::join(target.sizes(), ", ")));
    }
    if (source.scalar_type() != target.scalar_type()) {
      throw CheckpointError(fmt::format("{}: tensor '{}' is {} in the file but {} in the model", excerpt(origin, 256),
                                        excerpt(name), c10::toString(source.scalar_type()),
                                        c10::toString(target.scalar_type())));
    }
    copies.emplace_back(target, &source);
  }
  if (options.strict) {
    for (const auto& [name, t] : tensors) {
      if (model_names.contains(name)) continue;
      bool ignored = false;
      for (const auto& prefix : options.ignore_prefixes) ignored = ignored || name.starts_with(prefix);
      if (ignored) continue;
      // A Learner checkpoint also holds the optimizer's and the random generators' state beside the model.
      const bool learner_state = name.starts_with("optimizer/") || name.starts_with("rng/");
      throw CheckpointError(fmt::format(
          "{}: tensor '{}' is not in the model; {}", excerpt(origin, 256), excerpt(name),
          learner_state ? "the file is a Learner checkpoint: load it with Learner::load, or ignore the prefixes "
                          "\"optimizer/\" and \"rng/\" (ignore_prefixes)"
                        : "the file was saved from another model (load with strict = false to ignore it)"));
    }
  }
  return copies;
}

void copy_weights(const std::vector<std::pair<at::Tensor, const at::Tensor*>>& copies) {
  torch::NoGradGuard no_grad;
  for (const auto& [target, source] : copies) {
    auto t = target;
    t.copy_(*source);
  }
}

void load_weights(torch::nn::Module& model, const std::filesystem::path& file, const WeightsOptions& options) {
  const auto content = load_safetensors(file);
  copy_weights(match_weights(model, content.tensors, file.string(), options));
}

}  // namespace fastlearn::models
