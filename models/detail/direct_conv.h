#pragma once
// The kernels of a 2-d convolution in channels-last (NHWC) on float32, written as an implicit matrix product:
// every output pixel is a row of its kernel window's input pixels (a list of pointers, one per kernel tap, to
// that pixel's channels, or to zeros in the padding) times the weights, with the sums of a block of pixels and
// output channels held in vector registers over every tap and channel. The input gradient is the same product
// run backwards, one stride phase at a time (the input pixels that share which taps reach them), and the weight
// gradient sums, per tap, the products of the input pixels under it with their output pixels' gradients.
// Plain pointers, no LibTorch: models/conv2d.cpp prepares the tensors and splits the work across threads.
#include <fastlearn/models/detail/kernel_isa.h>

#include <cstdint>

namespace fastlearn::models {

/// The geometry of a convolution with groups 1 and dilation 1. Input (images, in_height, in_width, in_channels)
/// and output (images, out_height, out_width, out_channels), both NHWC and contiguous; or, with input_nchw, an
/// input the forward and the weight gradient read as it is in NCHW (contiguous), a channel apart every
/// in_height * in_width values (the kernels read input values one at a time, so a stride costs little, where
/// converting the input to NHWC first costs a pass over it). Gradients and outputs are always NHWC.
struct DirectConv {
  std::int64_t images = 0;
  std::int64_t in_height = 0, in_width = 0, in_channels = 0;
  std::int64_t out_height = 0, out_width = 0, out_channels = 0;
  std::int64_t kernel_h = 0, kernel_w = 0;
  std::int64_t stride_h = 1, stride_w = 1;
  std::int64_t pad_h = 0, pad_w = 0;
  bool input_nchw = false;

  std::int64_t taps() const { return kernel_h * kernel_w; }
  std::int64_t out_pixels() const { return images * out_height * out_width; }
  // Where the input's value (image n, row y, column x, channel c) is: n * in_image_stride() + y * in_row_stride()
  // + x * in_column_stride() + c * in_channel_stride().
  std::int64_t in_channel_stride() const { return input_nchw ? in_height * in_width : 1; }
  std::int64_t in_column_stride() const { return input_nchw ? 1 : in_channels; }
  std::int64_t in_row_stride() const { return in_width * in_column_stride(); }
  std::int64_t in_image_stride() const { return in_height * in_width * in_channels; }
};

/// The channel counts and kernels the kernels take: in_channels and out_channels multiples of 16, at most
/// kMaxDirectConvTaps taps, positive strides, padding smaller than the kernel.
constexpr std::int64_t kMaxDirectConvTaps = 49;
bool direct_conv_supports(const DirectConv& c);

/// A share [first, last) of the out_pixels() output pixels, in the kernels' own order (a split of
/// [0, out_pixels()) into shares covers every pixel once): out = bias + the window times the weights (bias may be
/// null). The input in either layout (input_nchw). weight_hwio: the weights laid out (kernel_h, kernel_w, in_channels,
/// out_channels), the transpose of a channels-last weight's memory (out_channels, kernel_h, kernel_w, in_channels).
void direct_conv_forward(const DirectConv& c, const float* input, const float* weight_hwio, const float* bias,
                         float* out, std::int64_t first, std::int64_t last, KernelIsa isa = KernelIsa::widest);

/// The input pixels of stride phase `phase` (row % stride_h * stride_w + column % stride_w): how many there are.
std::int64_t direct_conv_phase_pixels(const DirectConv& c, std::int64_t phase);

/// The input gradient of a share [first, last) of the phase's input pixels (in the kernels' own order, as in
/// direct_conv_forward), written (not added) to grad_input, NHWC whatever input_nchw says. weight_ohwi is a
/// channels-last weight's memory.
void direct_conv_input_grad(const DirectConv& c, const float* grad_output, const float* weight_ohwi, float* grad_input,
                            std::int64_t phase, std::int64_t first, std::int64_t last,
                            KernelIsa isa = KernelIsa::widest);

/// The weight gradient over output pixels [first, last), laid out (kernel_h, kernel_w, in_channels,
/// out_channels) as the forward pass reads the weights, written (not added) to grad_weight_hwio. Each sum runs
/// over the pixels in order. The input in either layout (input_nchw).
void direct_conv_weight_grad(const DirectConv& c, const float* input, const float* grad_output, float* grad_weight_hwio,
                             std::int64_t first, std::int64_t last, KernelIsa isa = KernelIsa::widest);

}  // namespace fastlearn::models
