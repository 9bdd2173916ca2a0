#include <fastlearn/models/dropout.h>

#include <fastlearn/core/error.h>
#include <fastlearn/models/detail/dropout_scope.h>

#include <fmt/format.h>
#include <torch/torch.h>

#include <utility>

namespace fastlearn::models {

namespace {
thread_local std::optional<at::Generator> scope_generator;
}  // namespace

DropoutGeneratorScope::DropoutGeneratorScope(at::Generator generator) : previous_(scope_generator) {
  if (!generator.defined()) throw Error("DropoutGeneratorScope: the generator is undefined");
  scope_generator = std::move(generator);
}

DropoutGeneratorScope::~DropoutGeneratorScope() { scope_generator = previous_; }

std::optional<at::Generator> exchange_dropout_scope(std::optional<at::Generator> generator) {
  return std::exchange(scope_generator, std::move(generator));
}

at::Tensor DropoutImpl::forward(const at::Tensor& input) {
  const double p = options.p();
  if (!scope_generator || !is_training() || p == 0 || scope_generator->device().type() != input.device().type()) {
    return torch::nn::DropoutImpl::forward(input);
  }
  if (p < 0 || p > 1) throw ConfigError(fmt::format("Dropout: p must be in [0, 1], got {}", p));
  if (p == 1) return options.inplace() ? input.zero_() : input * 0;
  // torch's own formula (input * mask / (1 - p)), with the mask drawn from the scope's generator.
  at::Tensor mask;
  {
    torch::NoGradGuard no_grad;
    mask = at::empty_like(input).bernoulli_(1 - p, *scope_generator).div_(1 - p);
  }
  return options.inplace() ? input.mul_(mask) : input * mask;
}

std::shared_ptr<torch::nn::Module> DropoutImpl::clone(const std::optional<torch::Device>&) const {
  auto copy = std::make_shared<DropoutImpl>(options);  // no parameters or buffers to copy
  copy->train(is_training());
  return copy;
}

}  // namespace fastlearn::models
