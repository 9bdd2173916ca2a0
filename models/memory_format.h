#pragma once
// Channels-last (NHWC) memory format for models and images. The values stay the same; only their order in
// memory changes, and oneDNN's CPU convolutions and GPU tensor cores run it faster (bench/README.md). A
// convolution whose weight is channels-last puts its input in that format itself and hands it on, so a
// model converted once makes every layer after its first convolution run channels-last.
#include <ATen/core/Tensor.h>

namespace torch::nn {
class Module;
}

namespace fastlearn::models {

/// Puts every 4-D parameter (and its gradient) and buffer of `model` in channels-last memory format, in
/// place: the tensors stay the same objects, so optimizers and hooks that hold them see the change.
void to_channels_last(torch::nn::Module& model);

/// `t` with channels-last strides: `t` itself when it has them; a view of `t`'s memory with new strides when it has
/// one channel stored row by row (its values are in channels-last order already); otherwise a copy.
at::Tensor as_channels_last(const at::Tensor& t);

}  // namespace fastlearn::models
