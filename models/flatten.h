#pragma once
// models::Flatten: torch::nn::Flatten (same options and result) whose backward hands the gradient back in the
// input's memory layout. Flattening a channels-last activation copies it into NCHW order, and torch's backward
// of that copy returns an NCHW gradient; the ReLU (or BatchNorm) before the flatten then reads two layouts at
// once, which ATen's elementwise loops run a few values at a time, several times slower than converting the
// gradient first (bench/README.md "Where the time goes").
#include <torch/nn/modules/linear.h>

namespace fastlearn::models {

/// False when the environment sets FASTLEARN_FLATTEN_KEEPS_LAYOUT=0: every models::Flatten then runs
/// torch::nn::Flatten's forward and backward (to compare). Read at each forward; any value but 0 or 1 throws
/// ConfigError.
bool flatten_keeps_layout_enabled();

class FlattenImpl : public torch::nn::FlattenImpl {
 public:
  explicit FlattenImpl(const torch::nn::FlattenOptions& options = {}) : torch::nn::FlattenImpl(options) {}
  /// The same result as torch::nn::FlattenImpl::forward. When `input` needs a gradient and is laid out
  /// channels-last (a copy to flatten), the gradient it gets back is channels-last too.
  torch::Tensor forward(const torch::Tensor& input);
  /// A copy that stays a models::Flatten (torch's clone would return its base class).
  std::shared_ptr<torch::nn::Module> clone(const std::optional<torch::Device>& device = std::nullopt) const override;
};
TORCH_MODULE(Flatten);

}  // namespace fastlearn::models
