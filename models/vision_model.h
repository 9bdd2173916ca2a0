#pragma once
// The model of fastai's vision_learner: a torchvision ResNet body (its layers up to layer4, optionally
// with weights exported from torchvision) and a new head for the data's classes, as fastai's create_head
// makes it: concat pooling (max and average), BatchNorm, dropout 0.25, linear to 512, ReLU, BatchNorm,
// dropout 0.5, linear to the classes. A Sequential of the two, so body_head_split gives fine_tune its
// frozen body and trained head.
#include <ATen/core/Tensor.h>
#include <torch/nn/modules/container/sequential.h>

#include <cstdint>
#include <filesystem>
#include <string>

namespace fastlearn::models {

struct VisionModelOptions {
  std::string arch = "resnet18";  ///< resnet18 | resnet34 | resnet50
  std::int64_t classes = 2;
  /// A torchvision state dict of the architecture (safetensors): the body loads from it strictly (every body
  /// tensor must be there with its shape; its fc is left out). Empty: random initialization.
  std::filesystem::path weights;
  std::int64_t hidden = 512;  ///< width of the head's hidden layer
  double dropout = 0.5;       ///< of the last linear layer; the first gets half of it
  /// Channels of the images. With `weights` (made for RGB) and another count, the first convolution's
  /// weights are adapted as fastai adapts them (first_layer_weights).
  std::int64_t in_channels = 3;
};

/// The first convolution's RGB weights (O, 3, kh, kw) for images of `channels` channels, as fastai's
/// vision_learner adapts pretrained weights: for 1, their sum over the three (a grey image then gives what the
/// RGB weights give for that grey copied to R, G and B); for 2, the first two times 1.5; for more than 3, the
/// three kept and zeros for the rest; for 3, unchanged.
at::Tensor first_layer_weights(const at::Tensor& rgb, std::int64_t channels);

/// Loads a torchvision state dict of the body's architecture (safetensors) into `body`, a TorchvisionResNet without
/// its head: strictly (every body tensor there with its shape, fc left out), conv1's RGB weights adapted by
/// first_layer_weights when the body takes another channel count.
void load_torchvision_body(torch::nn::Module& body, const std::filesystem::path& weights);

/// Sequential(body, head); the body's parameters are named "0.<torchvision name>", the head's "1.<index>...".
torch::nn::Sequential vision_model(const VisionModelOptions& options);

}  // namespace fastlearn::models
