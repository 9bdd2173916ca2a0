#include <fastlearn/models/vision_model.h>

#include <fastlearn/core/error.h>
#include <fastlearn/core/safetensors.h>
#include <fastlearn/models/dropout.h>
#include <fastlearn/models/sequential_block.h>
#include <fastlearn/models/torchvision_resnet.h>
#include <fastlearn/models/weights.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/torch.h>

namespace fastlearn::models {

namespace nn = torch::nn;

at::Tensor first_layer_weights(const at::Tensor& rgb, std::int64_t channels) {
  if (rgb.dim() != 4 || rgb.size(1) != 3 || channels < 1) {
    throw ConfigError(
        fmt::format("first_layer_weights: needs (O, 3, kh, kw) weights and a positive channel count, "
                    "got {} and {}",
                    fmt::join(rgb.sizes(), "x"), channels));
  }
  if (channels == 1) return rgb.sum(1, /*keepdim=*/true);
  if (channels == 2) return rgb.narrow(1, 0, 2) * 1.5;
  if (channels == 3) return rgb.clone();
  auto adapted = at::zeros({rgb.size(0), channels, rgb.size(2), rgb.size(3)}, rgb.options());
  adapted.narrow(1, 0, 3).copy_(rgb);
  return adapted;
}

void load_torchvision_body(nn::Module& body, const std::filesystem::path& weights) {
  auto content = load_safetensors(weights);
  const auto channels = body.named_parameters()["conv1.weight"].size(1);
  if (channels != 3) {
    for (auto& [name, tensor] : content.tensors) {
      if (name == "conv1.weight" && tensor.dim() == 4 && tensor.size(1) == 3) {
        tensor = first_layer_weights(tensor, channels);
      }
    }
  }
  copy_weights(match_weights(body, content.tensors, weights.string(), {.ignore_prefixes = {"fc."}}));
}

nn::Sequential vision_model(const VisionModelOptions& options) {
  if (options.classes < 1 || options.hidden < 1 || options.dropout < 0 || options.dropout >= 1) {
    throw ConfigError(fmt::format("vision_model: classes {} and hidden {} must be positive, dropout {} in [0, 1)",
                                  options.classes, options.hidden, options.dropout));
  }
  TorchvisionResNet body(TorchvisionResNetOptions{
      .depth = torchvision_resnet_depth(options.arch), .head = false, .in_channels = options.in_channels});
  if (!options.weights.empty()) load_torchvision_body(*body, options.weights);
  const auto features = 2 * body->feature_channels();  // max and average pooling side by side
  SequentialBlock head;
  head->push_back(nn::Functional(std::function<at::Tensor(at::Tensor)>([](at::Tensor x) {
    return torch::cat(std::vector<at::Tensor>{std::get<0>(torch::adaptive_max_pool2d(x, {1, 1})),
                                              torch::adaptive_avg_pool2d(x, {1, 1})},
                      1)
        .flatten(1);
  })));
  head->push_back(nn::BatchNorm1d(features));
  head->push_back(Dropout(options.dropout / 2));
  head->push_back(nn::Linear(nn::LinearOptions(features, options.hidden).bias(false)));
  head->push_back(nn::ReLU());
  head->push_back(nn::BatchNorm1d(options.hidden));
  head->push_back(Dropout(options.dropout));
  head->push_back(nn::Linear(nn::LinearOptions(options.hidden, options.classes).bias(false)));
  // fastai initializes the head's linear layers with Kaiming normal.
  for (auto& module : head->modules(/*include_self=*/false)) {
    if (auto* linear = module->as<nn::LinearImpl>()) nn::init::kaiming_normal_(linear->weight);
  }
  return nn::Sequential(body, head);
}

}  // namespace fastlearn::models
