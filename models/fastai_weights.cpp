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
constexpr int kHeadShift = 1;  // fastai's pooling and flatten are two modules, fastlearn's one

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

}  // namespace

std::string fastai_vision_name(std::string_view name) {
  if (name.starts_with("0.")) {
    const auto rest = name.substr(2);
    for (const auto& [child, index] : kBody) {
      if (rest.starts_with(child) && rest.size() > child.size() && rest[child.size()] == '.') {
        return fmt::format("0.{}.{}", index, rest.substr(child.size() + 1));
      }
    }
  } else if (name.starts_with("1.")) {
    if (const auto split = split_index(name.substr(2)); split && split->first >= 1)
      return fmt::format("1.{}.{}", split->first + kHeadShift, split->second);
  }
  outside("a fastlearn", name);
}

std::string fastlearn_vision_name(std::string_view name) {
  if (name.starts_with("0.")) {
    if (const auto split = split_index(name.substr(2))) {
      for (const auto& [child, index] : kBody) {
        if (index == split->first) return fmt::format("0.{}.{}", child, split->second);
      }
    }
  } else if (name.starts_with("1.")) {
    if (const auto split = split_index(name.substr(2)); split && split->first >= 1 + kHeadShift)
      return fmt::format("1.{}.{}", split->first - kHeadShift, split->second);
  }
  outside("a fastai", name);
}

NamedTensors fastai_vision_state_dict(torch::nn::Module& vision_model) {
  NamedTensors out;
  for (auto& [name, tensor] : model_tensors(vision_model)) out.emplace_back(fastai_vision_name(name), tensor);
  return out;
}

void load_fastai_vision_weights(torch::nn::Module& vision_model, const std::filesystem::path& file) {
  auto content = load_safetensors(file);
  NamedTensors renamed;
  for (auto& [name, tensor] : content.tensors) {
    try {
      renamed.emplace_back(fastlearn_vision_name(name), std::move(tensor));
    } catch (const ConfigError& e) {
      throw CheckpointError(fmt::format("{}: {}", excerpt(file.string(), 256), e.what()));
    }
  }
  copy_weights(match_weights(vision_model, renamed, file.string()));
}

}  // namespace fastlearn::models
