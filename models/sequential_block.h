#pragma once
// A Sequential that can sit inside another Sequential: AnyModule, which holds a Sequential's children, needs a
// forward with plain argument and return types, and SequentialImpl's is a template.
#include <torch/nn/modules/container/sequential.h>

namespace fastlearn::models {

class SequentialBlockImpl : public torch::nn::SequentialImpl {
 public:
  at::Tensor forward(const at::Tensor& x) { return torch::nn::SequentialImpl::forward(x); }
  /// A deep copy that stays a SequentialBlock (torch's clone would return its base class).
  std::shared_ptr<torch::nn::Module> clone(const std::optional<torch::Device>& device = std::nullopt) const override {
    auto copy = std::make_shared<SequentialBlockImpl>();
    for (const auto& child : *this) copy->push_back(child.clone(device));
    copy->train(is_training());
    return copy;
  }
};
TORCH_MODULE(SequentialBlock);

}  // namespace fastlearn::models
