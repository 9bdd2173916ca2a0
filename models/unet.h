#pragma once
// fastai's U-Net (DynamicUnet, as create_unet_model builds it on a torchvision ResNet) for segmentation: the ResNet
// body cut before its pooling; a BatchNorm, a ReLU and the middle convolutions (to twice the body's width and back);
// one UnetBlock per place where the body's activations change width, from the deepest up (PixelShuffle upsampling with
// ICNR initialisation, a nearest resize to the skip connection's size, the skip's own BatchNorm, two convolutions);
// a last PixelShuffle to the first convolution's scale, a nearest resize to the input's size, the input itself
// concatenated to the features (last_cross), a residual block and a 1x1 convolution to one map per class.
//
// Every choice is fastai's, so that weights pass both ways (models/fastai_weights.h): the decoder's convolutions have
// biases and no normalization, the skips are found from the activations' widths alone (so a body whose width stops
// halving at a small input, 16 pixels or fewer, has fewer blocks), and the initialisation is fastai's. The tensors
// carry fastai's names ("1.weight", "4.shuf.0.0.weight", "9.convpath.0.0.bias", ...), except the body's, which keeps
// torchvision's ("0.conv1.weight", "0.layer1.0.conv1.weight") as vision_model's does.
#include <fastlearn/core/image_size.h>
#include <fastlearn/models/torchvision_resnet.h>
#include <torch/nn/cloneable.h>
#include <torch/nn/pimpl.h>

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace fastlearn::models {

struct UnetOptions {
  std::string arch = "resnet34";  ///< the body: resnet18 | resnet34 | resnet50
  std::int64_t classes = 2;       ///< output maps (fastai's n_out)
  /// The training images' height and width (fastai's img_size): it decides where the skip connections are. The model
  /// takes any size afterwards (each block resizes to its skip's size, the output to the input's).
  ImageSize image_size;
  /// A torchvision state dict of the body's architecture (safetensors): loaded strictly into the body, its fc left
  /// out, as vision_model loads it. Empty: torchvision's random initialisation.
  std::filesystem::path weights;
  std::int64_t in_channels = 3;  ///< with `weights` and another count, conv1 adapted as vision_model adapts it
  bool blur = false;             ///< each upsampling followed by a 2x2 average over a replicated edge (fastai's blur)
  bool blur_final = true;        ///< with blur: the last block's upsampling blurred too
  std::optional<std::pair<double, double>> y_range;  ///< outputs squashed into (low, high) by a scaled sigmoid
  bool last_cross = true;  ///< the input concatenated to the last features, then a residual block
};

class UnetImpl : public torch::nn::Cloneable<UnetImpl> {
 public:
  explicit UnetImpl(UnetOptions options);
  /// Builds the layers from the options, initialised as fastai does; clone() copies the values after it.
  void reset() override;

  /// Maps (N, classes, H, W) of images (N, in_channels, H, W), any H and W.
  at::Tensor forward(const at::Tensor& x);

  const UnetOptions& options() const { return options_; }
  /// The body's children (0 conv1 .. 7 layer4) whose outputs feed the blocks, deepest first (fastai's sz_chg_idxs).
  const std::vector<int>& skips() const { return skips_; }

 private:
  UnetOptions options_;
  std::vector<int> skips_;
  bool final_shuffle_ = false;                // a last PixelShuffle up to the first convolution's scale
  std::vector<std::string> blocks_;           // the UnetBlocks' names, deepest first
  std::string shuffle_, cross_block_, head_;  // names of the layers after the blocks ("" when absent)
};
TORCH_MODULE(Unet);

/// The U-Net of `options`, its body loaded from options.weights when given. ConfigError for an unknown arch, classes or
/// in_channels below 1, an image size not set.
Unet unet(const UnetOptions& options);

}  // namespace fastlearn::models
