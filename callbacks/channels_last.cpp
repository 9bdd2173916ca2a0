#include <fastlearn/callbacks/channels_last.h>

#include <fastlearn/learner/learner.h>

#include <torch/nn/module.h>
#include <torch/utils.h>

namespace fastlearn {

namespace {

// A fresh copy with channels-last strides. Not contiguous(): a tensor with one channel (the first
// convolution's weight on grey images) counts as contiguous in both formats and would come back unchanged,
// still suggesting the default format, and that convolution would then run, and hand on, NCHW.
at::Tensor channels_last(const at::Tensor& t) { return at::empty_like(t, at::MemoryFormat::ChannelsLast).copy_(t); }

bool needs_conversion(const at::Tensor& t) {
  return t.defined() && t.dim() == 4 && !t.is_sparse() && t.suggest_memory_format() != at::MemoryFormat::ChannelsLast;
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
