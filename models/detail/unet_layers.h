#pragma once
// The U-Net's parts as fastai's layers.py builds them (names, order and initialisation), without normalization in the
// convolutions, as DynamicUnet asks for them (norm_type None):
//   ConvLayer         Sequential(conv with bias, [ReLU]): "0.weight", "0.bias"
//   PixelShuffle_ICNR Sequential(ConvLayer 1x1 to 4x the channels, PixelShuffle(2), [ReplicationPad2d, AvgPool2d])
//   UnetBlock         shuf (PixelShuffle_ICNR), bn (the skip's BatchNorm), conv1, conv2 (ConvLayers)
//   ResBlock          convpath: Sequential(ConvLayer with ReLU, ConvLayer without), added to its input, then ReLU
#include <ATen/core/Tensor.h>
#include <fastlearn/models/sequential_block.h>
#include <torch/nn/cloneable.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/pimpl.h>

#include <cstdint>

namespace fastlearn::models::detail {

/// fastai's ConvLayer(in, out, kernel, norm_type=None): weights Kaiming uniform (with the ReLU) or PyTorch's default
/// (without), biases normal with std `bias_std` (0: zeros).
SequentialBlock conv_layer(std::int64_t in, std::int64_t out, std::int64_t kernel, bool relu, double bias_std = 0.01);

/// fastai's PixelShuffle_ICNR(in, out, blur, norm_type=None): in channels at H x W to out channels at 2H x 2W.
SequentialBlock pixel_shuffle_icnr(std::int64_t in, std::int64_t out, bool blur);

/// fastai's BatchNorm(features): scale 1, shift 1e-3.
torch::nn::BatchNorm2d fastai_batch_norm(std::int64_t features);

/// fastai's apply_init(module, kaiming_normal_): every convolution's weight Kaiming normal, its bias zero.
void kaiming_normal_convolutions(torch::nn::Module& module);

class UnetBlockImpl : public torch::nn::Cloneable<UnetBlockImpl> {
 public:
  /// Upsamples `up_in` channels and joins `skip_in` channels; the last block (final_div false) halves its width.
  UnetBlockImpl(std::int64_t up_in, std::int64_t skip_in, bool final_div, bool blur);
  void reset() override;
  /// The block's output from the deeper features `up` and the skip connection `skip` (at twice up's size, or
  /// near it: the upsampled map is resized to the skip's size, nearest).
  at::Tensor forward(const at::Tensor& up, const at::Tensor& skip);
  std::int64_t out_channels() const { return out_; }

 private:
  std::int64_t up_in_, skip_in_, out_;
  bool final_div_, blur_;
};
TORCH_MODULE(UnetBlock);

class ResBlockImpl : public torch::nn::Cloneable<ResBlockImpl> {
 public:
  explicit ResBlockImpl(std::int64_t channels);
  void reset() override;
  at::Tensor forward(const at::Tensor& x);

 private:
  std::int64_t channels_;
};
TORCH_MODULE(ResBlock);

}  // namespace fastlearn::models::detail
