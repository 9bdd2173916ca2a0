#include <fastlearn/models/conv2d.h>
#include <fastlearn/models/detail/unet_layers.h>
#include <fastlearn/models/norm_layer.h>
#include <torch/torch.h>

namespace fastlearn::models::detail {

namespace nn = torch::nn;

namespace {

// fastai's icnr_init: a Kaiming normal kernel for a quarter of the outputs, each repeated for the four sub-pixels that
// PixelShuffle(2) makes of it, so that the upsampled map starts free of checkerboard artefacts. The views reproduce
// fastai's exactly (they reinterpret the transposed kernel's memory).
at::Tensor icnr(const at::Tensor& weight) {
  constexpr std::int64_t kSubPixels = 4;
  const auto out = weight.size(0), in = weight.size(1), kh = weight.size(2), kw = weight.size(3);
  auto k = torch::zeros({out / kSubPixels, in, kh, kw}, weight.options());
  nn::init::kaiming_normal_(k);
  k = k.transpose(0, 1).contiguous().view({out / kSubPixels, in, -1}).repeat({1, 1, kSubPixels});
  return k.contiguous().view({in, out, kh, kw}).transpose(0, 1);
}

}  // namespace

SequentialBlock conv_layer(std::int64_t in, std::int64_t out, std::int64_t kernel, bool relu, double bias_std) {
  Conv2d conv(nn::Conv2dOptions(in, out, kernel).padding((kernel - 1) / 2).bias(true));
  torch::NoGradGuard no_grad;
  if (bias_std != 0) {
    conv->bias.normal_(0, bias_std);
  } else {
    conv->bias.zero_();
  }
  // With a ReLU fastai's init='auto' is Kaiming uniform; without an activation it leaves PyTorch's default.
  if (relu) nn::init::kaiming_uniform_(conv->weight);
  SequentialBlock layer;
  layer->push_back(conv);
  if (relu) layer->push_back(nn::ReLU());
  return layer;
}

SequentialBlock pixel_shuffle_icnr(std::int64_t in, std::int64_t out, bool blur) {
  auto conv = conv_layer(in, out * 4, 1, /*relu=*/true, /*bias_std=*/0);
  {
    torch::NoGradGuard no_grad;
    auto& weight = conv[0]->as<Conv2dImpl>()->weight;
    weight.copy_(icnr(weight));
  }
  SequentialBlock layer;
  layer->push_back(conv);
  layer->push_back(nn::PixelShuffle(2));
  if (blur) {
    layer->push_back(nn::ReplicationPad2d(nn::ReplicationPad2dOptions({1, 0, 1, 0})));
    layer->push_back(nn::AvgPool2d(nn::AvgPool2dOptions(2).stride(1)));
  }
  return layer;
}

nn::BatchNorm2d fastai_batch_norm(std::int64_t features) {
  nn::BatchNorm2d bn(features);
  torch::NoGradGuard no_grad;
  bn->weight.fill_(1);
  bn->bias.fill_(1e-3);
  return bn;
}

void kaiming_normal_convolutions(nn::Module& module) {
  torch::NoGradGuard no_grad;
  for (auto& m : module.modules()) {
    if (auto* conv = m->as<nn::Conv2dImpl>()) {
      nn::init::kaiming_normal_(conv->weight);
      if (conv->bias.defined()) conv->bias.zero_();
    }
  }
}

UnetBlockImpl::UnetBlockImpl(std::int64_t up_in, std::int64_t skip_in, bool final_div, bool blur)
    : up_in_(up_in), skip_in_(skip_in), out_(0), final_div_(final_div), blur_(blur) {
  reset();
}

void UnetBlockImpl::reset() {
  const auto joined = up_in_ / 2 + skip_in_;
  out_ = final_div_ ? joined : joined / 2;
  register_module("shuf", pixel_shuffle_icnr(up_in_, up_in_ / 2, blur_));
  register_module("bn", fastai_batch_norm(skip_in_));
  register_module("conv1", conv_layer(joined, out_, 3, /*relu=*/true));
  register_module("conv2", conv_layer(out_, out_, 3, /*relu=*/true));
  kaiming_normal_convolutions(*children()[2]);
  kaiming_normal_convolutions(*children()[3]);
}

at::Tensor UnetBlockImpl::forward(const at::Tensor& up, const at::Tensor& skip) {
  // Through the module tree (shuf, bn, conv1, conv2), so that convert_sync_batchnorm can swap the BatchNorm.
  const auto c = children();
  auto up_out = c[0]->as<nn::SequentialImpl>()->forward(up);
  if (up_out.size(-2) != skip.size(-2) || up_out.size(-1) != skip.size(-1)) {
    up_out = at::upsample_nearest2d(up_out, {skip.size(-2), skip.size(-1)});
  }
  auto joined = torch::relu(torch::cat({up_out, batch_norm_forward(*c[1], skip)}, 1));
  return c[3]->as<nn::SequentialImpl>()->forward(c[2]->as<nn::SequentialImpl>()->forward(joined));
}

ResBlockImpl::ResBlockImpl(std::int64_t channels) : channels_(channels) { reset(); }

void ResBlockImpl::reset() {
  SequentialBlock path;
  path->push_back(conv_layer(channels_, channels_, 3, /*relu=*/true));
  path->push_back(conv_layer(channels_, channels_, 3, /*relu=*/false));
  register_module("convpath", path);
}

at::Tensor ResBlockImpl::forward(const at::Tensor& x) {
  return torch::relu(children()[0]->as<nn::SequentialImpl>()->forward(x) + x);
}

}  // namespace fastlearn::models::detail
