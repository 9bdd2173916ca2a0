#include <fastlearn/models/conv2d.h>

#include <fastlearn/core/detail/env_switch.h>
#include <fastlearn/core/detail/parallel.h>
#include <fastlearn/models/detail/direct_conv2d.h>
#include <fastlearn/models/detail/one_channel_conv.h>

#include <ATen/autocast_mode.h>
#include <torch/torch.h>

#include <algorithm>
#include <array>
#include <utility>
#include <variant>

namespace fastlearn::models {

bool patch_weight_grad_enabled() {
  return env_switch_on("FASTLEARN_CONV_PATCH_GRAD", "torch's convolution everywhere");
}

bool direct_conv_enabled() {
  return env_switch_on("FASTLEARN_DIRECT_CONV", "oneDNN's kernels for convolutions of 16k channels");
}

bool one_channel_kernels_enabled() {
  return env_switch_on("FASTLEARN_ONE_CHANNEL_CONV", "oneDNN's kernels for one-input-channel convolutions");
}

bool uses_one_channel_kernels(std::int64_t in_channels, std::int64_t out_channels, std::int64_t kernel_h,
                              std::int64_t kernel_w, bool channels_last_weight) {
  return in_channels == 1 && out_channels % 8 == 0 && kernel_h == 3 && kernel_w == 3 && channels_last_weight;
}

bool uses_direct_conv(std::int64_t output_pixels, const DirectConvRule& rule) {
  return output_pixels <= rule.max_output_pixels;
}

bool uses_patch_weight_grad(std::int64_t in_channels, std::int64_t out_channels, std::int64_t kernel_h,
                            std::int64_t kernel_w, std::int64_t output_pixels, const PatchGradRule& rule) {
  return in_channels >= rule.min_in_channels && out_channels >= rule.min_out_channels &&
         kernel_h * kernel_w >= rule.min_kernel_area && output_pixels <= rule.max_output_pixels;
}

namespace {

// The output pixels (along one dimension) whose input index o * stride - padding + offset falls inside [0, size).
std::pair<std::int64_t, std::int64_t> inside_range(std::int64_t size, std::int64_t out, std::int64_t stride,
                                                   std::int64_t padding, std::int64_t offset) {
  const auto floor_div = [stride](std::int64_t a) { return a >= 0 ? a / stride : -((-a + stride - 1) / stride); };
  const auto first = std::max<std::int64_t>(0, -floor_div(offset - padding));  // ceil((padding - offset) / stride)
  const auto last = std::min<std::int64_t>(out, floor_div(size - 1 + padding - offset) + 1);  // exclusive
  return {first, std::max(first, last)};
}

// dst (images, out_h, out_w, C) = the input pixels under kernel offset (i, j) of every output pixel, zero where
// that pixel falls in the padding.
void copy_kernel_offset(const at::Tensor& source_hwc, const at::Tensor& dst, std::array<std::int64_t, 2> offset,
                        at::IntArrayRef stride, at::IntArrayRef padding) {
  const auto [h0, h1] = inside_range(source_hwc.size(1), dst.size(1), stride[0], padding[0], offset[0]);
  const auto [w0, w1] = inside_range(source_hwc.size(2), dst.size(2), stride[1], padding[1], offset[1]);
  if (h1 - h0 < dst.size(1) || w1 - w0 < dst.size(2)) {
    dst.narrow(1, 0, h0).zero_();
    dst.narrow(1, h1, dst.size(1) - h1).zero_();
    dst.narrow(2, 0, w0).zero_();
    dst.narrow(2, w1, dst.size(2) - w1).zero_();
  }
  if (h1 == h0 || w1 == w0) return;
  const auto rows = source_hwc.narrow(1, h0 * stride[0] - padding[0] + offset[0], (h1 - h0 - 1) * stride[0] + 1)
                        .slice(1, 0, std::nullopt, stride[0]);
  const auto pixels = rows.narrow(2, w0 * stride[1] - padding[1] + offset[1], (w1 - w0 - 1) * stride[1] + 1)
                          .slice(2, 0, std::nullopt, stride[1]);
  dst.narrow(1, h0, h1 - h0).narrow(2, w0, w1 - w0).copy_(pixels);
}

}  // namespace

at::Tensor conv2d_weight_grad_by_patches(const at::Tensor& grad_output, const at::Tensor& input, at::IntArrayRef kernel,
                                         at::IntArrayRef stride, at::IntArrayRef padding,
                                         std::int64_t max_patch_elements) {
  TORCH_CHECK(
      input.dim() == 4 && grad_output.dim() == 4 && kernel.size() == 2 && stride.size() == 2 && padding.size() == 2,
      "conv2d_weight_grad_by_patches: needs 4-d input and grad_output and 2 kernel, stride, padding sizes");
  const auto n = input.size(0), channels = input.size(1);
  const auto out_channels = grad_output.size(1), out_h = grad_output.size(2), out_w = grad_output.size(3);
  const auto kh = kernel[0], kw = kernel[1], patch = kh * kw * channels;
  const auto rows_per_image = out_h * out_w;
  const auto chunk = std::clamp<std::int64_t>(max_patch_elements / std::max<std::int64_t>(1, rows_per_image * patch), 1,
                                              std::max<std::int64_t>(1, n));

  // One patch row per output pixel, laid out (images, out_h, out_w, kh, kw, C): each kernel offset is one
  // strided copy of the input (the padding is the zeroed border of that copy).
  auto patches = at::empty({std::min(chunk, n), out_h, out_w, kh, kw, channels},
                           input.options().memory_format(at::MemoryFormat::Contiguous));
  const auto input_hwc = input.permute({0, 2, 3, 1});
  const auto grad_hwc = grad_output.permute({0, 2, 3, 1});
  at::Tensor grad_weight_t;  // (kh * kw * C, O): patches^T x grad is the faster orientation for MKL here
  for (std::int64_t start = 0; start < n; start += chunk) {
    const auto images = std::min(chunk, n - start);
    const auto rows = patches.narrow(0, 0, images);
    const auto source = input_hwc.narrow(0, start, images);
    for (std::int64_t i = 0; i < kh; ++i) {
      for (std::int64_t j = 0; j < kw; ++j) {
        copy_kernel_offset(source, rows.select(4, j).select(3, i), {i, j}, stride, padding);
      }
    }
    const auto patch_rows = rows.view({images * rows_per_image, patch});
    const auto grad_rows = grad_hwc.narrow(0, start, images).reshape({images * rows_per_image, out_channels});
    if (grad_weight_t.defined()) {
      grad_weight_t.addmm_(patch_rows.t(), grad_rows);
    } else {
      grad_weight_t = at::mm(patch_rows.t(), grad_rows);
    }
  }
  return grad_weight_t.view({kh, kw, channels, out_channels}).permute({3, 2, 0, 1});
}

namespace {

// A backward that is itself differentiated (create_graph, e.g. a gradient penalty) goes through torch's
// convolution_backward, whose results carry a graph; the kernels' results would not.
torch::autograd::tensor_list differentiable_backward(torch::autograd::AutogradContext* ctx, const at::Tensor& grad,
                                                     const at::Tensor& input, const at::Tensor& weight, bool has_bias) {
  const auto stride = ctx->saved_data["stride"].toIntVector();
  const auto padding = ctx->saved_data["padding"].toIntVector();
  const std::array<bool, 3> wanted{ctx->needs_input_grad(0), ctx->needs_input_grad(1),
                                   has_bias && ctx->needs_input_grad(2)};
  const std::vector<std::int64_t> bias_sizes{weight.size(0)};
  auto [grad_input, grad_weight, grad_bias] =
      at::convolution_backward(grad, input, weight, bias_sizes, stride, padding, {1, 1}, false, {0, 0}, 1, wanted);
  return {grad_input, grad_weight, has_bias ? grad_bias : at::Tensor(), at::Tensor(), at::Tensor()};
}

// The patch product's weight gradient (its memory laid out (kh, kw, C, O)) in the weight's own layout. For a
// channels-last weight, memory (O, kh, kw, C), that is one 2-d transpose, which ATen copies about twice as fast
// as the same values through a 4-d permutation (0.19 against 0.36 ms for conv_net's last layer on one thread).
at::Tensor in_layout_of(const at::Tensor& weight, const at::Tensor& grad_weight) {
  if (weight.suggest_memory_format() != at::MemoryFormat::ChannelsLast) {
    return grad_weight.contiguous(weight.suggest_memory_format());
  }
  const auto out_channels = weight.size(0), channels = weight.size(1), kh = weight.size(2), kw = weight.size(3);
  const auto rows = grad_weight.permute({2, 3, 1, 0}).reshape({kh * kw * channels, out_channels});  // a view
  return rows.t().contiguous().view({out_channels, kh, kw, channels}).permute({0, 3, 1, 2});
}

// Forward as torch's convolution; backward: input and bias gradients as torch computes them, the weight
// gradient by patches.
struct ConvWithPatchWeightGrad : torch::autograd::Function<ConvWithPatchWeightGrad> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& input, const at::Tensor& weight,
                            const at::Tensor& bias, std::vector<std::int64_t> stride,
                            std::vector<std::int64_t> padding) {
    ctx->save_for_backward({input, weight});
    ctx->saved_data["stride"] = stride;
    ctx->saved_data["padding"] = padding;
    ctx->saved_data["has_bias"] = bias.numel() > 0;
    return at::conv2d(input, weight, bias.numel() > 0 ? bias : at::Tensor(), stride, padding);
  }

  static torch::autograd::tensor_list backward(torch::autograd::AutogradContext* ctx,
                                               torch::autograd::tensor_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto& input = saved[0];
    const auto& weight = saved[1];
    const auto stride = ctx->saved_data["stride"].toIntVector();
    const auto padding = ctx->saved_data["padding"].toIntVector();
    const auto& grad = grads[0];
    const bool has_bias = ctx->saved_data["has_bias"].toBool();
    if (torch::GradMode::is_enabled()) return differentiable_backward(ctx, grad, input, weight, has_bias);
    at::Tensor grad_input, grad_weight, grad_bias;
    if (ctx->needs_input_grad(0)) {
      grad_input = std::get<0>(at::convolution_backward(grad, input, weight, std::nullopt, stride, padding, {1, 1},
                                                        false, {0, 0}, 1, {true, false, false}));
    }
    if (ctx->needs_input_grad(1)) {
      grad_weight = in_layout_of(
          weight, conv2d_weight_grad_by_patches(grad, input, {weight.size(2), weight.size(3)}, stride, padding));
    }
    if (has_bias && ctx->needs_input_grad(2)) grad_bias = grad.sum({0, 2, 3});
    return {grad_input, grad_weight, grad_bias, at::Tensor(), at::Tensor()};
  }
};

// A 3x3 convolution with one input channel in a channels-last model, forward and weight and bias gradients by
// models/detail/one_channel_conv.h; an input gradient, which a first layer never needs, comes from torch.
struct OneChannelConvFunction : torch::autograd::Function<OneChannelConvFunction> {
  static OneChannelConv geometry(const at::Tensor& input, std::int64_t out_channels, at::IntArrayRef stride,
                                 at::IntArrayRef padding) {
    OneChannelConv c{.padded_height = input.size(2) + 2 * padding[0],
                     .padded_width = input.size(3) + 2 * padding[1],
                     .out_channels = out_channels,
                     .stride_h = stride[0],
                     .stride_w = stride[1]};
    c.out_height = (c.padded_height - 3) / c.stride_h + 1;
    c.out_width = (c.padded_width - 3) / c.stride_w + 1;
    return c;
  }

  // (N, 1, H, W) -> (N, H + 2 * pad_h, W + 2 * pad_w) with a zero border: the kernels then never test a bound.
  static at::Tensor padded_images(const at::Tensor& input, at::IntArrayRef padding) {
    const auto images = input.reshape({input.size(0), input.size(2), input.size(3)});
    return at::constant_pad_nd(images, {padding[1], padding[1], padding[0], padding[0]}).contiguous();
  }

  static at::Tensor run(const at::Tensor& padded, const at::Tensor& weight, const at::Tensor& bias,
                        const OneChannelConv& c) {
    const auto images = padded.size(0);
    TORCH_CHECK(weight.size(1) == 1 && weight.size(2) == 3 && weight.size(3) == 3 && c.out_channels % 8 == 0 &&
                    padded.is_contiguous(),
                "OneChannelConvFunction: needs a (8k, 1, 3, 3) weight and contiguous padded images");
    const auto taps = weight.permute({2, 3, 1, 0}).contiguous();  // (3, 3, 1, O)
    const auto bias_values = bias.numel() > 0 ? bias.contiguous() : at::Tensor();
    auto out = at::empty({images, c.out_channels, c.out_height, c.out_width},
                         padded.options().memory_format(at::MemoryFormat::ChannelsLast));
    const float* input_data = padded.const_data_ptr<float>();
    const float* tap_data = taps.const_data_ptr<float>();
    const float* bias_data = bias_values.defined() ? bias_values.const_data_ptr<float>() : nullptr;
    float* out_data = out.mutable_data_ptr<float>();
    parallel_for(0, images * c.out_height, 8, [&](std::int64_t first, std::int64_t last) {
      one_channel_conv_forward(c, input_data, tap_data, bias_data, out_data, first, last);
    });
    return out;
  }

  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& input, const at::Tensor& weight,
                            const at::Tensor& bias, std::vector<std::int64_t> stride,
                            std::vector<std::int64_t> padding) {
    const auto padded = padded_images(input, padding);
    ctx->save_for_backward({input, weight, padded});
    ctx->saved_data["stride"] = stride;
    ctx->saved_data["padding"] = padding;
    ctx->saved_data["has_bias"] = bias.numel() > 0;
    return run(padded, weight, bias, geometry(input, weight.size(0), stride, padding));
  }

  static torch::autograd::tensor_list backward(torch::autograd::AutogradContext* ctx,
                                               torch::autograd::tensor_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto& input = saved[0];
    const auto& weight = saved[1];
    const auto& padded = saved[2];
    const auto stride = ctx->saved_data["stride"].toIntVector();
    const auto padding = ctx->saved_data["padding"].toIntVector();
    const bool has_bias = ctx->saved_data["has_bias"].toBool();
    if (torch::GradMode::is_enabled()) return differentiable_backward(ctx, grads[0], input, weight, has_bias);
    const auto grad = grads[0].contiguous(at::MemoryFormat::ChannelsLast);
    at::Tensor grad_input, grad_weight, grad_bias;
    if (ctx->needs_input_grad(0)) {
      grad_input = std::get<0>(at::convolution_backward(grad, input, weight, std::nullopt, stride, padding, {1, 1},
                                                        false, {0, 0}, 1, {true, false, false}));
    }
    if (ctx->needs_input_grad(1) || (has_bias && ctx->needs_input_grad(2))) {
      const auto c = geometry(input, weight.size(0), stride, padding);
      const auto sums_per_chunk = 10 * c.out_channels;  // nine taps, then the bias, per output channel
      const auto rows = input.size(0) * c.out_height;
      // Fixed chunks of rows, each summed on its own, then added in chunk order: the same bits on any number of
      // threads.
      constexpr std::int64_t kRowsPerChunk = 16;
      const auto chunks = (rows + kRowsPerChunk - 1) / kRowsPerChunk;
      auto partial = at::empty({chunks, sums_per_chunk}, grad.options().memory_format(at::MemoryFormat::Contiguous));
      const float* input_data = padded.const_data_ptr<float>();
      const float* grad_data = grad.const_data_ptr<float>();
      float* partial_data = partial.mutable_data_ptr<float>();
      parallel_for(0, chunks, 1, [&](std::int64_t first, std::int64_t last) {
        for (auto chunk = first; chunk < last; ++chunk) {
          one_channel_conv_weight_grad(c, input_data, grad_data, partial_data + chunk * sums_per_chunk,
                                       chunk * kRowsPerChunk, std::min(rows, (chunk + 1) * kRowsPerChunk));
        }
      });
      auto total = at::zeros({sums_per_chunk}, partial.options());
      float* total_data = total.mutable_data_ptr<float>();
      for (std::int64_t chunk = 0; chunk < chunks; ++chunk) {
        for (std::int64_t k = 0; k < sums_per_chunk; ++k) total_data[k] += partial_data[chunk * sums_per_chunk + k];
      }
      if (ctx->needs_input_grad(1)) {
        const auto taps = total.narrow(0, 0, 9 * c.out_channels).view({3, 3, 1, c.out_channels});
        grad_weight = at::empty_like(weight, at::MemoryFormat::Preserve).copy_(taps.permute({3, 2, 0, 1}));
      }
      if (has_bias && ctx->needs_input_grad(2)) {
        grad_bias = total.narrow(0, 9 * c.out_channels, c.out_channels).clone();  // not a view holding the taps
      }
    }
    return {grad_input, grad_weight, grad_bias, at::Tensor(), at::Tensor()};
  }
};

}  // namespace

Conv2dImpl::Conv2dImpl(const torch::nn::Conv2dOptions& opts) : torch::nn::Conv2dImpl(opts) {}

torch::Tensor Conv2dImpl::forward(const torch::Tensor& input) {
  const auto* explicit_padding = std::get_if<torch::ExpandingArray<2>>(&options.padding());
  const bool plain = explicit_padding != nullptr && options.groups() == 1 &&
                     std::holds_alternative<torch::enumtype::kZeros>(options.padding_mode()) &&
                     (*options.dilation())[0] == 1 && (*options.dilation())[1] == 1;
  const bool cpu_float = input.dim() == 4 && input.device().is_cpu() && input.scalar_type() == at::kFloat &&
                         weight.scalar_type() == at::kFloat && !at::autocast::is_autocast_enabled(at::kCPU);
  if (!plain || !cpu_float) return torch::nn::Conv2dImpl::forward(input);
  const auto& kernel = *options.kernel_size();
  const std::vector<std::int64_t> stride((*options.stride()).begin(), (*options.stride()).end());
  const std::vector<std::int64_t> padding((**explicit_padding).begin(), (**explicit_padding).end());
  // A custom function takes defined tensors only: no bias travels as an empty one.
  const auto bias_or_empty = bias.defined() ? bias : at::empty({0}, weight.options());
  // Anything torch would refuse (channels or devices that do not match, a zero stride, negative padding, an
  // input smaller than the kernel) goes to torch, which says what is wrong.
  const bool one_channel_fits =
      input.size(1) == 1 && weight.size(1) == 1 && weight.device() == input.device() &&
      (!bias.defined() || bias.device() == input.device()) && stride[0] > 0 && stride[1] > 0 && padding[0] >= 0 &&
      padding[1] >= 0 && input.size(2) + 2 * padding[0] >= 3 && input.size(3) + 2 * padding[1] >= 3 &&
      uses_one_channel_kernels(input.size(1), weight.size(0), weight.size(2), weight.size(3),
                               weight.suggest_memory_format() == at::MemoryFormat::ChannelsLast);
  if (one_channel_fits && one_channel_kernels_enabled()) {
    const bool grads = torch::GradMode::is_enabled() &&
                       (input.requires_grad() || weight.requires_grad() || (bias.defined() && bias.requires_grad()));
    if (grads) return OneChannelConvFunction::apply(input, weight, bias_or_empty, stride, padding);
    return OneChannelConvFunction::run(OneChannelConvFunction::padded_images(input, padding), weight, bias_or_empty,
                                       OneChannelConvFunction::geometry(input, weight.size(0), stride, padding));
  }
  const auto output_side = [&](int d) { return (input.size(d + 2) + 2 * padding[d] - kernel[d]) / stride[d] + 1; };
  if (direct_conv2d_supports(input, weight, bias, stride, padding) &&
      uses_direct_conv(output_side(0) * output_side(1)) && direct_conv_enabled()) {
    return direct_conv2d(input, weight, bias, stride, padding);
  }
  if (!torch::GradMode::is_enabled() || !weight.requires_grad() || stride[0] <= 0 || stride[1] <= 0 ||
      !uses_patch_weight_grad(input.size(1), weight.size(0), kernel[0], kernel[1], output_side(0) * output_side(1)) ||
      !patch_weight_grad_enabled()) {
    return torch::nn::Conv2dImpl::forward(input);
  }
  return ConvWithPatchWeightGrad::apply(input, weight, bias_or_empty, stride, padding);
}

std::shared_ptr<torch::nn::Module> Conv2dImpl::clone(const std::optional<torch::Device>& device) const {
  const auto copy = std::dynamic_pointer_cast<torch::nn::Conv2dImpl>(torch::nn::Conv2dImpl::clone(device));
  return std::shared_ptr<Conv2dImpl>(new Conv2dImpl(*copy));
}

}  // namespace fastlearn::models
