#include <fastlearn/models/flatten.h>

#include <fastlearn/core/detail/env_switch.h>

#include <torch/torch.h>

namespace fastlearn::models {

bool flatten_keeps_layout_enabled() {
  return env_switch_on("FASTLEARN_FLATTEN_KEEPS_LAYOUT", "torch's flatten, whose gradient is NCHW");
}

namespace {

// input.flatten(start, end) forward; backward, the gradient reshaped to the input's sizes in the input's layout.
struct FlattenKeepingLayout : torch::autograd::Function<FlattenKeepingLayout> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& input, std::int64_t start_dim,
                            std::int64_t end_dim) {
    ctx->saved_data["sizes"] = input.sizes().vec();
    ctx->saved_data["layout"] = static_cast<std::int64_t>(input.suggest_memory_format());
    return input.flatten(start_dim, end_dim);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    if (!grads[0].defined()) return {at::Tensor(), at::Tensor(), at::Tensor()};
    const auto layout = static_cast<at::MemoryFormat>(ctx->saved_data["layout"].toInt());
    return {grads[0].reshape(ctx->saved_data["sizes"].toIntVector()).contiguous(layout), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

torch::Tensor FlattenImpl::forward(const torch::Tensor& input) {
  const bool enabled = flatten_keeps_layout_enabled();
  // A contiguous input flattens to a view whose gradient is already in its layout.
  const bool keep_layout = enabled && input.requires_grad() &&
                           input.suggest_memory_format() != at::MemoryFormat::Contiguous && !input.is_contiguous();
  if (!keep_layout) return torch::nn::FlattenImpl::forward(input);
  return FlattenKeepingLayout::apply(input, options.start_dim(), options.end_dim());
}

std::shared_ptr<torch::nn::Module> FlattenImpl::clone(const std::optional<torch::Device>&) const {
  return std::make_shared<FlattenImpl>(options);  // no parameters or buffers to copy
}

}  // namespace fastlearn::models
