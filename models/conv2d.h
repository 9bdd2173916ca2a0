#pragma once
// models::Conv2d: torch::nn::Conv2d (same options, parameters, names and forward) that runs fastlearn's own
// kernels where oneDNN's are slower: on small output maps with channel counts of 16s, its channels-last direct
// kernels for the forward and both gradients (models/detail/direct_conv2d.h); for the first layer of a channels-last
// model on grey images, its one-input-channel kernels (models/detail/one_channel_conv.h); for other deep layers on
// small maps, the weight gradient as one matrix product over the input's patches. ARCHITECTURE.md "Kernel choices" says
// why each rule is where it is; bench/README.md has the measurements.
#include <torch/nn/modules/conv.h>

#include <cstdint>

namespace fastlearn::models {

/// When Conv2dImpl::forward takes the patch-product path (otherwise it is torch::nn::Conv2dImpl::forward): deep
/// layers on small maps, at most a 4x4 output map per image and at least 128 channels, a kernel larger than 1x1.
struct PatchGradRule {
  std::int64_t min_in_channels = 128;
  std::int64_t min_out_channels = 128;
  std::int64_t min_kernel_area = 2;     ///< kernel height x width
  std::int64_t max_output_pixels = 16;  ///< output height x width, per image
};

/// False when the environment sets FASTLEARN_CONV_PATCH_GRAD=0: every models::Conv2d then runs torch's
/// convolution (to compare, or to rule the patch product out). Read at each forward; any value but 0 or 1
/// throws ConfigError.
bool patch_weight_grad_enabled();

/// When Conv2dImpl::forward runs fastlearn's direct kernels (models/detail/direct_conv2d.h): output maps of at most 7x7
/// pixels per image.
struct DirectConvRule {
  std::int64_t max_output_pixels = 49;  ///< output height x width, per image
};

/// True when a convolution with this output map (height x width per image) runs the direct kernels under `rule`
/// (its tensors must also suit them: direct_conv2d_supports).
bool uses_direct_conv(std::int64_t output_pixels, const DirectConvRule& rule = {});

/// False when the environment sets FASTLEARN_DIRECT_CONV=0: convolutions whose channel counts are multiples of 16
/// then run oneDNN's kernels (or the patch product) instead of models/detail/direct_conv2d.h. Read at each forward; any
/// value but 0 or 1 throws ConfigError.
bool direct_conv_enabled();

/// False when the environment sets FASTLEARN_ONE_CHANNEL_CONV=0: convolutions with one input channel then run
/// oneDNN's kernels (to compare, or to rule ours out). Read at each forward; any value but 0 or 1 throws ConfigError.
bool one_channel_kernels_enabled();

/// True when a convolution takes fastlearn's one-input-channel kernels (models/detail/one_channel_conv.h) for its
/// forward and its weight and bias gradients: the first layer of a channels-last model on grey images, 3x3, with
/// a multiple of 8 output channels.
bool uses_one_channel_kernels(std::int64_t in_channels, std::int64_t out_channels, std::int64_t kernel_h,
                              std::int64_t kernel_w, bool channels_last_weight);

/// True when a convolution with these channel counts, kernel and output map (height x width per image) computes
/// its weight gradient as a patch product under `rule`.
bool uses_patch_weight_grad(std::int64_t in_channels, std::int64_t out_channels, std::int64_t kernel_h,
                            std::int64_t kernel_w, std::int64_t output_pixels, const PatchGradRule& rule = {});

/// The weight gradient of a 2-d convolution (groups 1, dilation 1, zero padding) computed as
/// patches^T x grad_output, the patches of the (zero-padded) input laid out one output pixel per row (im2col).
/// It works through the batch in chunks so that the patch matrix stays under `max_patch_elements`. The result
/// has the weight's shape (O, C, kh, kw), with O as its fastest dimension.
at::Tensor conv2d_weight_grad_by_patches(const at::Tensor& grad_output, const at::Tensor& input, at::IntArrayRef kernel,
                                         at::IntArrayRef stride, at::IntArrayRef padding,
                                         std::int64_t max_patch_elements = std::int64_t{1} << 22);

class Conv2dImpl : public torch::nn::Conv2dImpl {
 public:
  explicit Conv2dImpl(const torch::nn::Conv2dOptions& options);
  /// The same convolution as torch::nn::Conv2dImpl::forward. With float32 CPU tensors outside autocast, groups
  /// 1, dilation 1 and zero padding: where uses_one_channel_kernels accepts, forward and the weight and bias
  /// gradients run fastlearn's one-channel kernels; where direct_conv2d_supports and uses_direct_conv accept, the
  /// forward and every gradient run the direct kernels; where uses_patch_weight_grad accepts, backward computes
  /// the weight gradient with conv2d_weight_grad_by_patches (the input and bias gradients as torch does).
  torch::Tensor forward(const torch::Tensor& input);
  /// A deep copy that stays a models::Conv2d (torch's clone would return its base class).
  std::shared_ptr<torch::nn::Module> clone(const std::optional<torch::Device>& device = std::nullopt) const override;

 private:
  explicit Conv2dImpl(const torch::nn::Conv2dImpl& copy) : torch::nn::Conv2dImpl(copy) {}
};
TORCH_MODULE(Conv2d);

}  // namespace fastlearn::models
