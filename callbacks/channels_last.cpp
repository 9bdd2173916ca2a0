#include <fastlearn/callbacks/channels_last.h>

#include <fastlearn/learner/learner.h>

#include <torch/nn/module.h>
#include <torch/utils.h>

namespace fastlearn {

namespace {

at::Tensor channels_last(const at::Tensor& t) { return t.contiguous(at::MemoryFormat::ChannelsLast); }

bool needs_conversion(const at::Tensor& t) {
  return t.defined() && t.dim() == 4 && !t.is_sparse() && !t.is_contiguous(at::MemoryFormat::ChannelsLast);
}

}  // namespace

void to_channels_last(torch::nn::Module& model) {
  torch::NoGradGuard no_grad;
  for (auto& p : model.parameters()) {
    if (!needs_conversion(p)) continue;
    p.set_data(channels_last(p));  // the same Variable: the optimizer's and the reducer's references stay valid
    auto& grad = p.mutable_grad();
    if (needs_conversion(grad)) grad = channels_last(grad);
  }
  for (auto& b : model.buffers()) {
    if (needs_conversion(b)) b.set_data(channels_last(b));
  }
}

void ChannelsLast::before_fit() { to_channels_last(learn().model()); }

void ChannelsLast::before_batch() {
  for (auto& x : learn().xb) {
    if (needs_conversion(x)) x = channels_last(x);
  }
}

}  // namespace fastlearn
