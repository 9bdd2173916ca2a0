#include <fastlearn/models/norm_layer.h>

#include <fastlearn/core/error.h>

#include <fmt/format.h>
#include <torch/nn/modules/batchnorm.h>

namespace fastlearn::models {

at::Tensor batch_norm_forward(torch::nn::Module& norm, const at::Tensor& input) {
  namespace nn = torch::nn;
  if (auto* layer = dynamic_cast<NormLayer*>(&norm)) return layer->normalize(input);
  if (auto* bn = dynamic_cast<nn::BatchNorm1dImpl*>(&norm)) return bn->forward(input);
  if (auto* bn = dynamic_cast<nn::BatchNorm2dImpl*>(&norm)) return bn->forward(input);
  if (auto* bn = dynamic_cast<nn::BatchNorm3dImpl*>(&norm)) return bn->forward(input);
  throw ConfigError(
      fmt::format("batch_norm_forward: {} is neither a torch::nn::BatchNorm1d/2d/3d nor a NormLayer "
                  "(such as SyncBatchNorm)",
                  norm.name()));
}

}  // namespace fastlearn::models
