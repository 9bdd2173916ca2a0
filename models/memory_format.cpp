#include <fastlearn/models/memory_format.h>

#include <torch/nn/module.h>
#include <torch/utils.h>

namespace fastlearn::models {

namespace {

// A fresh copy with channels-last strides. Not contiguous(): a tensor with one channel (the first
// convolution's weight on grey images) counts as contiguous in both formats and would come back unchanged,
// still suggesting the default format, and that convolution would then run, and hand on, NCHW.
at::Tensor channels_last_copy(const at::Tensor& t) {
  return at::empty_like(t, at::MemoryFormat::ChannelsLast).copy_(t);
}

bool needs_conversion(const at::Tensor& t) {
  return t.defined() && t.dim() == 4 && !t.is_sparse() && t.suggest_memory_format() != at::MemoryFormat::ChannelsLast;
}

// A one-channel tensor laid out (N, 1, H, W) row by row has its values in channels-last order already: only the
// strides need to say so, and a copy of every batch would buy nothing.
bool one_channel_rows(const at::Tensor& t) {
  const auto h = t.size(2), w = t.size(3);
  return t.size(1) == 1 && (w == 1 || t.stride(3) == 1) && (h == 1 || t.stride(2) == w) &&
         (t.size(0) == 1 || t.stride(0) == h * w);
}

}  // namespace

at::Tensor as_channels_last(const at::Tensor& t) {
  if (!needs_conversion(t)) return t;
  if (one_channel_rows(t)) return t.as_strided(t.sizes(), {t.size(2) * t.size(3), 1, t.size(3), 1});
  return channels_last_copy(t);
}

void to_channels_last(torch::nn::Module& model) {
  torch::NoGradGuard no_grad;
  for (auto& p : model.parameters()) {
    if (!needs_conversion(p)) continue;
    p.set_data(channels_last_copy(p));  // the same Variable: the optimizer's and the reducer's references stay valid
    auto& grad = p.mutable_grad();
    grad = as_channels_last(grad);
  }
  for (auto& b : model.buffers()) {
    if (needs_conversion(b)) b.set_data(channels_last_copy(b));
  }
}

}  // namespace fastlearn::models
