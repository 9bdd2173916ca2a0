#include <fastlearn/models/detail/direct_conv2d.h>

#include <fastlearn/core/detail/parallel.h>
#include <fastlearn/models/detail/direct_conv.h>

#include <torch/torch.h>

#include <algorithm>

namespace fastlearn::models {

namespace {

DirectConv geometry(const at::Tensor& input, const at::Tensor& weight, at::IntArrayRef stride,
                    at::IntArrayRef padding) {
  DirectConv c{.images = input.size(0),
               .in_height = input.size(2),
               .in_width = input.size(3),
               .in_channels = input.size(1),
               .out_channels = weight.size(0),
               .kernel_h = weight.size(2),
               .kernel_w = weight.size(3),
               .stride_h = stride.size() > 0 ? stride[0] : 0,
               .stride_w = stride.size() > 1 ? stride[1] : 0,
               .pad_h = padding.size() > 0 ? padding[0] : -1,
               .pad_w = padding.size() > 1 ? padding[1] : -1};
  if (c.stride_h > 0 && c.stride_w > 0) {
    c.out_height = (c.in_height + 2 * c.pad_h - c.kernel_h) / c.stride_h + 1;
    c.out_width = (c.in_width + 2 * c.pad_w - c.kernel_w) / c.stride_w + 1;
  }
  return c;
}

// The input as the kernels read it: as it is when contiguous in either format (NCHW through input_nchw), else a
// channels-last copy.
at::Tensor kernel_input(const at::Tensor& input) {
  if (input.is_contiguous(at::MemoryFormat::ChannelsLast) || input.is_contiguous()) return input;
  return input.contiguous(at::MemoryFormat::ChannelsLast);
}

// The geometry of the kernels' call on kernel_input(input).
DirectConv kernel_geometry(const at::Tensor& kernel_in, const at::Tensor& weight, at::IntArrayRef stride,
                           at::IntArrayRef padding) {
  auto c = geometry(kernel_in, weight, stride, padding);
  c.input_nchw = !kernel_in.is_contiguous(at::MemoryFormat::ChannelsLast);
  return c;
}

// Work items of about this many multiply-adds per thread share at least: smaller convolutions stay on one thread.
constexpr std::int64_t kGrainMacs = std::int64_t{1} << 18;

std::int64_t grain(std::int64_t items, std::int64_t macs) {
  return std::max<std::int64_t>(1, kGrainMacs * items / std::max<std::int64_t>(1, macs));
}

at::Tensor forward_output(const at::Tensor& input, const at::Tensor& weight_ohwi, const at::Tensor& bias,
                          const DirectConv& c) {
  // (O, kh, kw, C) -> (kh, kw, C, O): one 2-d transpose, ATen's blocked copy.
  const auto packed =
      weight_ohwi.permute({0, 2, 3, 1}).reshape({c.out_channels, c.taps() * c.in_channels}).t().contiguous();
  auto out = at::empty({c.images, c.out_channels, c.out_height, c.out_width},
                       input.options().memory_format(at::MemoryFormat::ChannelsLast));
  const auto bias_values = bias.defined() ? bias.contiguous() : at::Tensor();
  const float* input_data = input.const_data_ptr<float>();
  const float* weight_data = packed.const_data_ptr<float>();
  const float* bias_data = bias_values.defined() ? bias_values.const_data_ptr<float>() : nullptr;
  float* out_data = out.mutable_data_ptr<float>();
  const auto pixels = c.out_pixels();
  parallel_for(0, pixels, grain(pixels, pixels * c.taps() * c.in_channels * c.out_channels),
               [&](std::int64_t first, std::int64_t last) {
                 direct_conv_forward(c, input_data, weight_data, bias_data, out_data, first, last);
               });
  return out;
}

at::Tensor input_gradient(const at::Tensor& grad_nhwc, const at::Tensor& weight_ohwi, const DirectConv& c) {
  auto grad_input = at::empty({c.images, c.in_channels, c.in_height, c.in_width},
                              grad_nhwc.options().memory_format(at::MemoryFormat::ChannelsLast));
  const float* grad_data = grad_nhwc.const_data_ptr<float>();
  const float* weight_data = weight_ohwi.const_data_ptr<float>();
  float* out_data = grad_input.mutable_data_ptr<float>();
  const auto macs_per_pixel = c.taps() * c.in_channels * c.out_channels / (c.stride_h * c.stride_w);
  for (std::int64_t phase = 0; phase < c.stride_h * c.stride_w; ++phase) {
    const auto pixels = direct_conv_phase_pixels(c, phase);
    parallel_for(0, pixels, grain(pixels, pixels * std::max<std::int64_t>(1, macs_per_pixel)),
                 [&](std::int64_t first, std::int64_t last) {
                   direct_conv_input_grad(c, grad_data, weight_data, out_data, phase, first, last);
                 });
  }
  return grad_input;
}

// The weight gradient (kh, kw, C, O) summed over fixed slices of the output pixels, each slice's sums added in
// slice order: the slices do not depend on the thread count, so neither do the bits.
at::Tensor weight_gradient_hwio(const at::Tensor& input, const at::Tensor& grad_nhwc, const DirectConv& c) {
  const auto weight_size = c.taps() * c.in_channels * c.out_channels;
  const auto pixels = c.out_pixels();
  // A slice sums at least 256 pixels; at most 8 slices keep the partial sums' memory small.
  const auto slices = std::clamp<std::int64_t>(pixels / 256, 1, 8);
  auto partial = at::empty({slices, weight_size}, grad_nhwc.options().memory_format(at::MemoryFormat::Contiguous));
  const float* input_data = input.const_data_ptr<float>();
  const float* grad_data = grad_nhwc.const_data_ptr<float>();
  float* partial_data = partial.mutable_data_ptr<float>();
  parallel_for(0, slices, 1, [&](std::int64_t first, std::int64_t last) {
    for (auto slice = first; slice < last; ++slice) {
      direct_conv_weight_grad(c, input_data, grad_data, partial_data + slice * weight_size, pixels * slice / slices,
                              pixels * (slice + 1) / slices);
    }
  });
  auto total = partial[0];
  for (std::int64_t slice = 1; slice < slices; ++slice) total = total.add_(partial[slice]);
  return total;
}

// The (kh, kw, C, O) gradient in the weight's shape and memory format.
at::Tensor in_weight_layout(const at::Tensor& hwio, const at::Tensor& weight) {
  const auto out_channels = weight.size(0), channels = weight.size(1), kh = weight.size(2), kw = weight.size(3);
  if (weight.suggest_memory_format() == at::MemoryFormat::ChannelsLast) {
    // Channels-last memory is (O, kh, kw, C): one 2-d transpose of (kh * kw * C, O).
    return hwio.view({kh * kw * channels, out_channels})
        .t()
        .contiguous()
        .view({out_channels, kh, kw, channels})
        .permute({0, 3, 1, 2});
  }
  return hwio.view({kh, kw, channels, out_channels}).permute({3, 2, 0, 1}).contiguous();
}

struct DirectConvFunction : torch::autograd::Function<DirectConvFunction> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& input, const at::Tensor& weight,
                            const at::Tensor& bias, std::vector<std::int64_t> stride,
                            std::vector<std::int64_t> padding) {
    const auto kernel_in = kernel_input(input);
    const auto c = kernel_geometry(kernel_in, weight, stride, padding);
    const auto weight_ohwi = weight.contiguous(at::MemoryFormat::ChannelsLast);
    ctx->save_for_backward({input, weight, kernel_in, weight_ohwi});  // the same tensors where already as needed
    ctx->saved_data["stride"] = stride;
    ctx->saved_data["padding"] = padding;
    ctx->saved_data["has_bias"] = bias.numel() > 0;
    const auto out = forward_output(kernel_in, weight_ohwi, bias.numel() > 0 ? bias : at::Tensor(), c);
    return out.contiguous(input.suggest_memory_format());
  }

  static torch::autograd::tensor_list backward(torch::autograd::AutogradContext* ctx,
                                               torch::autograd::tensor_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto& input = saved[0];
    const auto& weight = saved[1];
    const auto& kernel_in = saved[2];
    const auto& weight_ohwi = saved[3];
    const auto stride = ctx->saved_data["stride"].toIntVector();
    const auto padding = ctx->saved_data["padding"].toIntVector();
    const bool has_bias = ctx->saved_data["has_bias"].toBool();
    const auto input_format = input.suggest_memory_format();
    const std::array<bool, 3> wanted{ctx->needs_input_grad(0), ctx->needs_input_grad(1),
                                     has_bias && ctx->needs_input_grad(2)};
    if (torch::GradMode::is_enabled()) {
      // A backward that is itself differentiated: torch's, whose results carry a graph.
      const std::vector<std::int64_t> bias_sizes{weight.size(0)};
      auto [grad_input, grad_weight, grad_bias] = at::convolution_backward(grads[0], input, weight, bias_sizes, stride,
                                                                           padding, {1, 1}, false, {0, 0}, 1, wanted);
      return {grad_input, grad_weight, has_bias ? grad_bias : at::Tensor(), at::Tensor(), at::Tensor()};
    }
    const auto grad = grads[0].contiguous(at::MemoryFormat::ChannelsLast);
    const auto c = kernel_geometry(kernel_in, weight_ohwi, stride, padding);
    at::Tensor grad_input, grad_weight, grad_bias;
    if (wanted[0]) grad_input = input_gradient(grad, weight_ohwi, c).contiguous(input_format);
    if (wanted[1]) grad_weight = in_weight_layout(weight_gradient_hwio(kernel_in, grad, c), weight);
    if (wanted[2]) grad_bias = grad.sum({0, 2, 3});
    return {grad_input, grad_weight, grad_bias, at::Tensor(), at::Tensor()};
  }
};

}  // namespace

bool direct_conv2d_supports(const at::Tensor& input, const at::Tensor& weight, const at::Tensor& bias,
                            at::IntArrayRef stride, at::IntArrayRef padding) {
  const auto cpu_float = [&](const at::Tensor& t) {
    return t.device() == input.device() && t.scalar_type() == at::kFloat && !t.is_sparse();
  };
  if (input.dim() != 4 || weight.dim() != 4 || !input.device().is_cpu() || !cpu_float(input) || !cpu_float(weight) ||
      (bias.defined() && bias.numel() > 0 && (!cpu_float(bias) || bias.numel() != weight.size(0))) ||
      input.size(1) != weight.size(1) || input.size(0) == 0 || stride.size() != 2 || padding.size() != 2) {
    return false;
  }
  const auto c = geometry(input, weight, stride, padding);
  return direct_conv_supports(c) && c.in_height + 2 * c.pad_h >= c.kernel_h && c.in_width + 2 * c.pad_w >= c.kernel_w;
}

at::Tensor direct_conv2d(const at::Tensor& input, const at::Tensor& weight, const at::Tensor& bias,
                         at::IntArrayRef stride, at::IntArrayRef padding) {
  TORCH_CHECK(direct_conv2d_supports(input, weight, bias, stride, padding),
              "direct_conv2d: a convolution its kernels do not take (see direct_conv2d_supports)");
  const auto bias_or_empty =
      bias.defined() ? bias : at::empty({0}, weight.options());  // a function takes defined tensors
  const std::vector<std::int64_t> strides(stride.begin(), stride.end()), pads(padding.begin(), padding.end());
  const bool grads = torch::GradMode::is_enabled() &&
                     (input.requires_grad() || weight.requires_grad() || (bias.defined() && bias.requires_grad()));
  if (grads) return DirectConvFunction::apply(input, weight, bias_or_empty, strides, pads);
  return direct_conv2d_output(input, weight, bias, stride, padding).contiguous(input.suggest_memory_format());
}

at::Tensor direct_conv2d_output(const at::Tensor& input, const at::Tensor& weight, const at::Tensor& bias,
                                at::IntArrayRef stride, at::IntArrayRef padding) {
  TORCH_CHECK(direct_conv2d_supports(input, weight, bias, stride, padding), "direct_conv2d_output: not supported");
  const auto kernel_in = kernel_input(input);
  return forward_output(kernel_in, weight.contiguous(at::MemoryFormat::ChannelsLast),
                        bias.defined() && bias.numel() > 0 ? bias : at::Tensor(),
                        kernel_geometry(kernel_in, weight, stride, padding));
}

at::Tensor direct_conv2d_input_grad(const at::Tensor& grad_output, const at::Tensor& input, const at::Tensor& weight,
                                    at::IntArrayRef stride, at::IntArrayRef padding) {
  TORCH_CHECK(direct_conv2d_supports(input, weight, at::Tensor(), stride, padding),
              "direct_conv2d_input_grad: not supported");
  return input_gradient(grad_output.contiguous(at::MemoryFormat::ChannelsLast),
                        weight.contiguous(at::MemoryFormat::ChannelsLast), geometry(input, weight, stride, padding));
}

at::Tensor direct_conv2d_weight_grad(const at::Tensor& grad_output, const at::Tensor& input, const at::Tensor& weight,
                                     at::IntArrayRef stride, at::IntArrayRef padding) {
  TORCH_CHECK(direct_conv2d_supports(input, weight, at::Tensor(), stride, padding),
              "direct_conv2d_weight_grad: not supported");
  const auto kernel_in = kernel_input(input);
  return in_weight_layout(weight_gradient_hwio(kernel_in, grad_output.contiguous(at::MemoryFormat::ChannelsLast),
                                               kernel_geometry(kernel_in, weight, stride, padding)),
                          weight);
}

}  // namespace fastlearn::models
