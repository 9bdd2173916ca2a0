#pragma once
// Ready-made models for apps and tests: an MLP, a small CNN (with BatchNorm: conv_net), a small
// xresnet-style ResNet with BatchNorm, and a fully convolutional net from fields to fields (field_cnn). Each is a
// torch::nn::Sequential, so parameter names are "<index>.<name>" as in a Python nn.Sequential of the same layers.
#include <torch/nn/modules/container/sequential.h>

#include <cstdint>
#include <vector>

namespace fastlearn::models {

/// Flatten, then Linear + ReLU for each hidden size, then a Linear to `out`.
torch::nn::Sequential mlp(std::int64_t in, const std::vector<std::int64_t>& hidden, std::int64_t out);

/// Three stride-2 3x3 convolutions with ReLU (channels 1 -> 32 -> 64 -> 64; 28x28 -> 14 -> 7 -> 4) and a
/// linear classifier over the flattened 64x4x4 features. Input (N, in_channels, 28, 28).
torch::nn::Sequential simple_cnn(std::int64_t classes, std::int64_t in_channels = 1);

struct ConvNetOptions {
  std::vector<std::int64_t> widths{32, 64, 128, 256};  ///< channels of each stride-2 convolution
  std::int64_t classes = 10;
  std::int64_t in_channels = 1;
  std::int64_t input_size = 28;  ///< height = width of the input; sets the classifier's input size
};

/// simple_cnn with BatchNorm and a width per layer: for each width a stride-2 3x3 convolution (no bias),
/// BatchNorm and ReLU (28x28 -> 14 -> 7 -> 4 -> 2), then a linear classifier over the flattened features.
/// Every convolution is strided, so it costs a fraction of a ResNet with full-size stages (see bench/README.md).
torch::nn::Sequential conv_net(const ConvNetOptions& options = {});

struct ResNetOptions {
  std::vector<std::int64_t> widths{32, 64, 128};  ///< channels of each stage; stages after the first halve the size
  std::int64_t blocks_per_stage = 1;
  std::int64_t classes = 10;
  std::int64_t in_channels = 1;
  std::int64_t stem_width = 32;
};

/// An xresnet-style network: a stem of two 3x3 conv-BN-ReLU, residual stages of basic blocks (two 3x3
/// conv-BN, the second BN's scale starting at zero, average-pool + 1x1 conv shortcut when the shape
/// changes), global average pooling and a linear head. Any input size.
torch::nn::Sequential resnet(const ResNetOptions& options = {});

struct FieldCnnOptions {
  std::int64_t in_channels = 1;
  std::int64_t out_channels = 1;
  std::vector<std::int64_t>
      hidden;                    ///< channels of each hidden layer (a convolution and a ReLU); empty: one convolution
  std::int64_t kernel_size = 3;  ///< odd: zero padding keeps the field's height and width
  /// > 0: the samples are fields of one channel without a channel dimension, (height, W), and so are the outputs.
  std::int64_t height = 0;
};

/// A surrogate of a grid's update (a stencil, a solver's time step): stride-1 convolutions with zero padding, so each
/// output point sees the input points within (kernel_size / 2) * (hidden layers + 1) of it, and a field of any size
/// maps to one of the same size. With no hidden layer it is one linear convolution, which can represent an explicit
/// finite-difference step exactly (zero padding: a boundary held at zero). Input (N, in_channels, H, W), or (N, height,
/// W) with options.height.
torch::nn::Sequential field_cnn(const FieldCnnOptions& options = {});

/// Parameter groups for fine_tune: everything but the last layer (the body), and the last layer (the head).
std::vector<std::vector<at::Tensor>> body_head_split(torch::nn::Module& model);

}  // namespace fastlearn::models
