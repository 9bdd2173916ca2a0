#pragma once
// torchvision's ResNet-18, -34 and -50 (resnet.py, "v1.5": the stride of a bottleneck is on its 3x3
// convolution), with the same layers under the same names: conv1, bn1, layer1..layer4 of blocks "0", "1",
// ... (conv1, bn1, conv2, bn2[, conv3, bn3], downsample.0 / .1) and fc. Their state dicts therefore equal
// torchvision's key for key and shape for shape, so weights exported from torchvision (safetensors) load
// strictly. BatchNorms are called through the module tree, so convert_sync_batchnorm can swap them.
#include <fastlearn/models/conv2d.h>
#include <torch/nn/cloneable.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/pimpl.h>

#include <cstdint>
#include <functional>
#include <string>

namespace fastlearn::models {

struct TorchvisionResNetOptions {
  int depth = 18;               ///< 18, 34 or 50
  std::int64_t classes = 1000;  ///< outputs of fc
  /// false: no avgpool and fc; forward returns the body's feature maps (a body for vision_model's head).
  bool head = true;
  std::int64_t in_channels = 3;  ///< channels of the images conv1 takes (torchvision's: 3)
};

class TorchvisionResNetImpl : public torch::nn::Cloneable<TorchvisionResNetImpl> {
 public:
  explicit TorchvisionResNetImpl(const TorchvisionResNetOptions& options = {});
  /// Builds the layers from the options (initialized as torchvision does); clone() copies the values after it.
  void reset() override;

  /// Logits (N, classes) of images (N, in_channels, H, W), any H, W >= 32; without the head, features(x).
  at::Tensor forward(const at::Tensor& x);
  /// The body's output, before pooling: (N, features(), H/32, W/32).
  at::Tensor features(const at::Tensor& x);
  /// features(x), showing `tap` the output of each of torchvision's first eight children in turn (0 conv1, 1 bn1,
  /// 2 relu, 3 maxpool, 4..7 layer1..layer4), as hooks on fastai's cut body see them (the U-Net's skip connections).
  at::Tensor features(const at::Tensor& x, const std::function<void(int child, const at::Tensor& output)>& tap);
  /// Channels of the body's output (512 for 18 and 34, 2048 for 50).
  std::int64_t feature_channels() const { return feature_channels_; }
  int depth() const { return depth_; }

 private:
  TorchvisionResNetOptions options_;
  Conv2d conv1_{nullptr};
  torch::nn::Sequential layers_[4];
  torch::nn::Linear fc_{nullptr};
  std::int64_t feature_channels_ = 0;
  int depth_ = 0;
};
TORCH_MODULE(TorchvisionResNet);

/// torchvision.models.resnet18 / 34 / 50 with `classes` outputs, initialized as torchvision does (Kaiming
/// normal convolutions, BatchNorm scale 1 and shift 0).
TorchvisionResNet resnet18(std::int64_t classes = 1000);
TorchvisionResNet resnet34(std::int64_t classes = 1000);
TorchvisionResNet resnet50(std::int64_t classes = 1000);
/// The depth of "resnet18", "resnet34" or "resnet50"; ConfigError naming the choices otherwise.
int torchvision_resnet_depth(const std::string& arch);
/// The model named `arch` (see torchvision_resnet_depth).
TorchvisionResNet torchvision_resnet(const std::string& arch, std::int64_t classes = 1000);

}  // namespace fastlearn::models
