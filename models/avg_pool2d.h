#pragma once
// models::AvgPool2d: torch::nn::AvgPool2d (same options and result) that averages the 2x2 windows of a large
// channels-last CUDA tensor as a mean over a view of it. ATen's channels-last pooling kernels took 1.22 ms
// forward and backward for (64, 256, 56, 56) in bf16 on an H100, the mean 0.25 ms; on the CPU the pooling
// kernel is the faster one (bench/python/pool_kernels.py; bench/README.md has the figures).
#include <torch/nn/modules/pooling.h>

#include <cstdint>

namespace fastlearn::models {

/// False when the environment sets FASTLEARN_POOL_BY_VIEW=0: every models::AvgPool2d then runs ATen's pooling
/// kernel (to compare, or to rule the view out). Read at each forward; any value but 0 or 1 throws ConfigError.
bool pool_by_view_enabled();

/// Whether AvgPool2dImpl::forward averages `input` over a view (when pool_by_view_enabled): kernel and stride 2, no
/// padding and no divisor override, a 4-d CUDA tensor in channels-last memory format with even height and width and at
/// least `min_elements` elements (below about that the pooling kernel won).
bool pools_by_view(const at::Tensor& input, const torch::nn::AvgPool2dOptions& options,
                   std::int64_t min_elements = 12'000'000);

/// The 2x2, stride-2 average of a channels-last (N, C, H, W) tensor with even H and W, as a mean over its
/// (N, H/2, 2, W/2, 2, C) view; the result is channels-last. Any device.
at::Tensor avg_pool_2x2_by_view(const at::Tensor& input);

class AvgPool2dImpl : public torch::nn::AvgPool2dImpl {
 public:
  explicit AvgPool2dImpl(const torch::nn::AvgPool2dOptions& opts) : torch::nn::AvgPool2dImpl(opts) {}
  /// torch::nn::AvgPool2dImpl::forward, by avg_pool_2x2_by_view where pools_by_view says so and
  /// pool_by_view_enabled.
  torch::Tensor forward(const torch::Tensor& input);
  /// A copy that stays a models::AvgPool2d (torch's clone would return its base class).
  std::shared_ptr<torch::nn::Module> clone(const std::optional<torch::Device>& device = std::nullopt) const override;
};
TORCH_MODULE(AvgPool2d);

}  // namespace fastlearn::models
