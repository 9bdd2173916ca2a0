#include <fastlearn/models/avg_pool2d.h>

#include <fastlearn/core/detail/env_switch.h>

#include <torch/torch.h>

namespace fastlearn::models {

bool pool_by_view_enabled() { return env_switch_on("FASTLEARN_POOL_BY_VIEW", "ATen's pooling kernel everywhere"); }

bool pools_by_view(const at::Tensor& input, const torch::nn::AvgPool2dOptions& options, std::int64_t min_elements) {
  const auto& kernel = *options.kernel_size();
  const auto& stride = *options.stride();
  const auto& padding = *options.padding();
  const bool two_by_two = kernel[0] == 2 && kernel[1] == 2 && stride[0] == 2 && stride[1] == 2 && padding[0] == 0 &&
                          padding[1] == 0 && !options.divisor_override().has_value();
  return two_by_two && input.is_cuda() && input.dim() == 4 && input.size(2) % 2 == 0 && input.size(3) % 2 == 0 &&
         input.numel() >= min_elements && input.is_contiguous(at::MemoryFormat::ChannelsLast);
}

at::Tensor avg_pool_2x2_by_view(const at::Tensor& input) {
  const auto n = input.size(0), c = input.size(1), h = input.size(2), w = input.size(3);
  // Channels-last: the NHWC permutation is contiguous, so each 2x2 window is two pairs of a plain view.
  const auto windows = input.permute({0, 2, 3, 1}).reshape({n, h / 2, 2, w / 2, 2, c});
  return windows.mean({2, 4}).permute({0, 3, 1, 2});
}

torch::Tensor AvgPool2dImpl::forward(const torch::Tensor& input) {
  const bool by_view = pool_by_view_enabled() && pools_by_view(input, options);
  return by_view ? avg_pool_2x2_by_view(input) : torch::nn::AvgPool2dImpl::forward(input);
}

std::shared_ptr<torch::nn::Module> AvgPool2dImpl::clone(const std::optional<torch::Device>&) const {
  return std::make_shared<AvgPool2dImpl>(options);  // no parameters or buffers to copy
}

}  // namespace fastlearn::models
