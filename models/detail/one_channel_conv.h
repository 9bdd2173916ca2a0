#pragma once
// The kernels of a 3x3 convolution with one input channel, the first layer of a model on grey images, in
// channels-last: every output pixel is nine taps times a row of output channels, contiguous in NHWC. oneDNN's
// kernels for that shape run at a few GFLOP/s (bench one_channel_conv). Plain pointers, no LibTorch:
// models/conv2d.cpp prepares the tensors and splits the work across threads.
#include <fastlearn/models/detail/kernel_isa.h>

#include <cstdint>

namespace fastlearn::models {

/// The geometry: the input zero-padded beforehand to (images, padded_height, padded_width), the output
/// (images, out_height, out_width, out_channels) with out_channels a multiple of 8, and the weights as
/// (3, 3, out_channels), tap-major.
struct OneChannelConv {
  std::int64_t padded_height = 0, padded_width = 0;
  std::int64_t out_height = 0, out_width = 0, out_channels = 0;
  std::int64_t stride_h = 1, stride_w = 1;
};

/// Output rows [first, last) (row r: image r / out_height, output row r % out_height):
/// out = bias + the nine taps in kernel order (bias may be null).
void one_channel_conv_forward(const OneChannelConv& c, const float* padded_input, const float* weight_taps,
                              const float* bias, float* out, std::int64_t first, std::int64_t last,
                              KernelIsa isa = KernelIsa::widest);

/// The weight gradient (3, 3, out_channels) of output rows [first, last), then the bias gradient (out_channels),
/// written (not added) to `sums`: 10 * out_channels floats. Each sum runs over the rows in order.
void one_channel_conv_weight_grad(const OneChannelConv& c, const float* padded_input, const float* grad_output,
                                  float* sums, std::int64_t first, std::int64_t last,
                                  KernelIsa isa = KernelIsa::widest);

}  // namespace fastlearn::models
