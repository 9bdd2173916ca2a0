#include <fastlearn/models/fastai_weights.h>

#include <fastlearn/core/detail/text.h>
#include <fastlearn/core/error.h>
#include <fastlearn/core/safetensors.h>
#include <fastlearn/models/weights.h>

#include <fmt/format.h>
#include <torch/torch.h>

#include <array>
#include <charconv>
#include <optional>

namespace fastlearn::models {

namespace {

// fastlearn's body children and fastai's index of each (torchvision's children: conv1, bn1, relu, maxpool, layers).
constexpr std::array<std::pair<std::string_view, int>, 6> kBody{
    {{"conv1", 0}, {"bn1", 1}, {"layer1", 4}, {"layer2", 5}, {"layer3", 6}, {"layer4", 7}}};
constexpr int kHeadShift = 1;                        // fastai's pooling and flatten are two modules, fastlearn's one
constexpr std::string_view kUnetPrefix = "layers.";  // DynamicUnet (a SequentialEx) holds its layers in a ModuleList

// "<index>.<rest>" split at the first dot, the index read as a number.
std::optional<std::pair<int, std::string_view>> split_index(std::string_view name) {
  const auto dot = name.find('.');
  if (dot == std::string_view::npos || dot == 0) return std::nullopt;
  int index = 0;
  const auto [end, error] = std::from_chars(name.data(), name.data() + dot, index);
  if (error != std::errc() || end != name.data() + dot) return std::nullopt;
  return std::pair{index, name.substr(dot + 1)};
}

[[noreturn]] void outside(std::string_view side, std::string_view name) {
  throw ConfigError(fmt::format(
      "'{}' is not a tensor of {} vision model (a torchvision ResNet body and create_head's head): the names map "
      "between fastai's vision_learner models and fastlearn's vision_model only",
      excerpt(name), side));
}

// The body's tensors, "0.<torchvision child>.<rest>" in fastlearn, "0.<index>.<rest>" in fastai; nullopt elsewhere.
std::optional<std::string> fastai_body_name(std::string_view name) {
  if (!name.starts_with("0.")) return std::nullopt;
  const auto rest = name.substr(2);
  for (const auto& [child, index] : kBody) {
    if (rest.starts_with(child) && rest.size() > child.size() && rest[child.size()] == '.') {
      return fmt::format("0.{}.{}", index, rest.substr(child.size() + 1));
    }
  }
  return std::nullopt;
}

std::optional<std::string> fastlearn_body_name(std::string_view name) {
  if (!name.starts_with("0.")) return std::nullopt;
  if (const auto split = split_index(name.substr(2))) {
    for (const auto& [child, index] : kBody) {
      if (index == split->first) return fmt::format("0.{}.{}", child, split->second);
    }
  }
  return std::nullopt;
}

// Loads `file`'s tensors into `model` under the names `rename` gives them; CheckpointError naming the file otherwise.
void load_renamed(torch::nn::Module& model, const std::filesystem::path& file,
                  std::string (*rename)(std::string_view fastai_name)) {
  auto content = load_safetensors(file);
  NamedTensors renamed;
  for (auto& [name, tensor] : content.tensors) {
    try {
      renamed.emplace_back(rename(name), std::move(tensor));
    } catch (const ConfigError& e) {
      throw CheckpointError(fmt::format("{}: {}", excerpt(file.string(), 256), e.what()));
    }
  }
  copy_weights(match_weights(model, renamed, file.string()));
}

NamedTensors renamed_state_dict(torch::nn::Module& model, std::string (*rename)(std::string_view fastlearn_name)) {
  NamedTensors out;
  for (auto& [name, tensor] : model_tensors(model)) out.emplace_back(rename(name), tensor);
  return out;
}

}  // namespace

std::string fastai_vision_name(std::string_view name) {
  if (auto body = fastai_body_name(name)) {
    return *body;
  } else if (name.starts_with("1.")) {
    if (const auto split = split_index(name.substr(2)); split && split->first >= 1)
      return fmt::format("1.{}.{}", split->first + kHeadShift, split->second);
  }
  outside("a fastlearn", name);
}

std::string fastlearn_vision_name(std::string_view name) {
  if (auto body = fastlearn_body_name(name)) {
    return *body;
  } else if (name.starts_with("1.")) {
    if (const auto split = split_index(name.substr(2)); split && split->first >= 1 + kHeadShift)
      return fmt::format("1.{}.{}", split->first - kHeadShift, split->second);
  }
  outside("a fastai", name);
}

NamedTensors fastai_vision_state_dict(torch::nn::Module& vision_model) {
  return renamed_state_dict(vision_model, fastai_vision_name);
}

void load_fastai_vision_weights(torch::nn::Module& vision_model, const std::filesystem::path& file) {
  load_renamed(vision_model, file, fastlearn_vision_name);
}

std::string fastai_unet_name(std::string_view name) {
  if (auto body = fastai_body_name(name)) return fmt::format("{}{}", kUnetPrefix, *body);
  if (name.starts_with("0.")) {
    throw ConfigError(fmt::format("'{}' is not a tensor of a fastlearn U-Net's torchvision body", excerpt(name)));
  }
  return fmt::format("{}{}", kUnetPrefix, name);
}

std::string fastlearn_unet_name(std::string_view name) {
  if (!name.starts_with(kUnetPrefix)) {
    throw ConfigError(fmt::format("'{}' is not a tensor of a fastai U-Net (DynamicUnet's names start with '{}')",
                                  excerpt(name), kUnetPrefix));
  }
  name.remove_prefix(kUnetPrefix.size());
  if (auto body = fastlearn_body_name(name)) return *body;
  if (name.starts_with("0.")) {
    throw ConfigError(fmt::format(
        "'{}{}' is not a tensor of a fastai U-Net's body (torchvision's conv1, bn1, layer1..layer4 at 0.0, 0.1, "
        "0.4..0.7)",
        kUnetPrefix, excerpt(name)));
  }
  return std::string(name);
}

NamedTensors fastai_unet_state_dict(torch::nn::Module& unet) { return renamed_state_dict(unet, fastai_unet_name); }

void load_fastai_unet_weights(torch::nn::Module& unet, const std::filesystem::path& file) {
  load_renamed(unet, file, fastlearn_unet_name);
}

}  // namespace fastlearn::models
