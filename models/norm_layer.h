#pragma once
// NormLayer: how a model calls a normalization child through the module tree, so that a pass such as
// convert_sync_batchnorm (distributed/sync_batch_norm.h) can swap the child without the model knowing.
#include <ATen/core/Tensor.h>

namespace torch::nn {
class Module;
}

namespace fastlearn::models {

/// A normalization module other than torch::nn::BatchNorm1d/2d/3d (SyncBatchNorm is one) that
/// batch_norm_forward can run.
class NormLayer {
 public:
  virtual ~NormLayer() = default;
  virtual at::Tensor normalize(const at::Tensor& input) = 0;
};

/// Runs `norm`, a torch::nn::BatchNorm1d/2d/3d or a NormLayer given as a plain module (ConfigError
/// otherwise): for custom modules that call their normalization child by name.
at::Tensor batch_norm_forward(torch::nn::Module& norm, const at::Tensor& input);

}  // namespace fastlearn::models
