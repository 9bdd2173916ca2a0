#pragma once
// Small ready-made models for images like Fashion-MNIST.
#include <torch/nn/modules/container/sequential.h>

#include <cstdint>

namespace fastlearn::models {

/// Three stride-2 3x3 convolutions with ReLU (channels 1 -> 32 -> 64 -> 64; 28x28 -> 14 -> 7 -> 4) and a
/// linear classifier over the flattened 64x4x4 features. Input (N, in_channels, 28, 28).
torch::nn::Sequential simple_cnn(std::int64_t classes, std::int64_t in_channels = 1);

}  // namespace fastlearn::models
