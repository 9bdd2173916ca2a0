#pragma once
// A 2-d convolution on fastlearn's channels-last kernels (models/detail/direct_conv.h), forward and backward, as an
// autograd function over LibTorch tensors: the work split across LibTorch's threads, the weight gradient summed in
// a fixed order (the same bits on any thread count), an input in either memory format.
#include <ATen/core/Tensor.h>

#include <cstdint>

namespace fastlearn::models {

/// True when direct_conv2d takes this convolution: float32 CPU tensors on one device, groups 1, dilation 1,
/// zero padding smaller than the kernel, at most 49 taps, and input and output channels multiples of 16.
bool direct_conv2d_supports(const at::Tensor& input, const at::Tensor& weight, const at::Tensor& bias,
                            at::IntArrayRef stride, at::IntArrayRef padding);

/// at::conv2d(input, weight, bias, stride, padding) (bias may be undefined) on the kernels; its gradients with
/// respect to input, weight and bias come from them too (a backward that is itself differentiated, with
/// create_graph, goes through torch's convolution_backward). The output and the input gradient have the input's
/// memory format, the weight gradient the weight's. Requires direct_conv2d_supports.
at::Tensor direct_conv2d(const at::Tensor& input, const at::Tensor& weight, const at::Tensor& bias,
                         at::IntArrayRef stride, at::IntArrayRef padding);

/// The three parts of direct_conv2d on their own (for benchmarks and tests), no autograd: the output
/// (channels-last), the input gradient (channels-last) and the weight gradient (in the weight's memory format)
/// of a convolution direct_conv2d_supports, from the upstream gradient `grad_output`.
at::Tensor direct_conv2d_output(const at::Tensor& input, const at::Tensor& weight, const at::Tensor& bias,
                                at::IntArrayRef stride, at::IntArrayRef padding);
at::Tensor direct_conv2d_input_grad(const at::Tensor& grad_output, const at::Tensor& input, const at::Tensor& weight,
                                    at::IntArrayRef stride, at::IntArrayRef padding);
at::Tensor direct_conv2d_weight_grad(const at::Tensor& grad_output, const at::Tensor& input, const at::Tensor& weight,
                                     at::IntArrayRef stride, at::IntArrayRef padding);

}  // namespace fastlearn::models
