#pragma once
// A Sequential that can sit inside another Sequential: AnyModule, which holds a Sequential's children, needs a
// forward with plain argument and return types, and SequentialImpl's is a template.
#include <torch/nn/modules/container/sequential.h>

namespace fastlearn::models {

class SequentialBlockImpl : public torch::nn::SequentialImpl {
 public:
  at::Tensor forward(const at::Tensor& x) { return torch::nn::SequentialImpl::forward(x); }
};
TORCH_MODULE(SequentialBlock);

}  // namespace fastlearn::models
