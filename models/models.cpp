#include <fastlearn/models/models.h>

#include <fastlearn/core/error.h>
#include <fastlearn/models/avg_pool2d.h>
#include <fastlearn/models/conv2d.h>
#include <fastlearn/models/flatten.h>
#include <fastlearn/models/norm_layer.h>

#include <torch/torch.h>

#include <set>

namespace fastlearn::models {

namespace nn = torch::nn;

nn::Sequential mlp(std::int64_t in, const std::vector<std::int64_t>& hidden, std::int64_t out) {
  nn::Sequential model;
  model->push_back(Flatten());
  std::int64_t width = in;
  for (auto h : hidden) {
    model->push_back(nn::Linear(width, h));
    model->push_back(nn::ReLU());
    width = h;
  }
  model->push_back(nn::Linear(width, out));
  return model;
}

nn::Sequential field_cnn(const FieldCnnOptions& o) {
  if (o.kernel_size < 1 || o.kernel_size % 2 == 0)
    throw ConfigError("field_cnn: kernel_size must be odd (a field keeps its size), got " +
                      std::to_string(o.kernel_size));
  nn::Sequential model;
  if (o.height > 0) {
    if (o.in_channels != 1 || o.out_channels != 1)
      throw ConfigError("field_cnn: fields without a channel dimension (height > 0) have one channel in and out");
    model->push_back(nn::Unflatten(nn::UnflattenOptions(1, {1, o.height})));
  }
  const auto conv = [&](std::int64_t in, std::int64_t out) {
    return Conv2d(nn::Conv2dOptions(in, out, o.kernel_size).padding(o.kernel_size / 2));
  };
  std::int64_t width = o.in_channels;
  for (const auto h : o.hidden) {
    model->push_back(conv(width, h));
    model->push_back(nn::ReLU());
    width = h;
  }
  model->push_back(conv(width, o.out_channels));
  if (o.height > 0) model->push_back(nn::Flatten(nn::FlattenOptions().start_dim(1).end_dim(2)));
  return model;
}

nn::Sequential simple_cnn(std::int64_t classes, std::int64_t in_channels) {
  auto conv = [](std::int64_t in, std::int64_t out) {
    return Conv2d(nn::Conv2dOptions(in, out, 3).stride(2).padding(1));
  };
  // One statement per layer: the layers draw their initial weights in order whatever the compiler (the
  // arguments of one call are evaluated in an unspecified order: GCC right to left, clang left to right).
  nn::Sequential model;
  model->push_back(conv(in_channels, 32));
  model->push_back(nn::ReLU());
  model->push_back(conv(32, 64));
  model->push_back(nn::ReLU());
  model->push_back(conv(64, 64));
  model->push_back(nn::ReLU());
  model->push_back(Flatten());
  model->push_back(nn::Linear(64 * 4 * 4, classes));
  return model;
}

nn::Sequential conv_net(const ConvNetOptions& options) {
  if (options.widths.empty() || options.classes < 1 || options.in_channels < 1 || options.input_size < 1) {
    throw ConfigError("models::conv_net: needs at least one width, classes >= 1, in_channels >= 1 and input_size >= 1");
  }
  nn::Sequential model;
  std::int64_t channels = options.in_channels, size = options.input_size;
  for (const auto width : options.widths) {
    if (width < 1) throw ConfigError("models::conv_net: width " + std::to_string(width) + " is not positive");
    model->push_back(Conv2d(nn::Conv2dOptions(channels, width, 3).stride(2).padding(1).bias(false)));
    model->push_back(nn::BatchNorm2d(width));
    model->push_back(nn::ReLU());
    channels = width;
    size = (size + 1) / 2;  // a stride-2, padding-1 3x3 convolution rounds up
  }
  model->push_back(Flatten());
  model->push_back(nn::Linear(channels * size * size, options.classes));
  return model;
}

namespace {

// Convolution (no bias), BatchNorm, optional ReLU: the unit every layer of the ResNet is made of. Cloneable
// (reset() builds the children from the stored sizes), so data parallel replicas can be copied from it.
struct ConvBnImpl : nn::Cloneable<ConvBnImpl> {
  ConvBnImpl(std::int64_t in_, std::int64_t out_, std::int64_t kernel_, std::int64_t stride_, bool relu_,
             bool zero_bn_ = false)
      : in(in_), out(out_), kernel(kernel_), stride(stride_), relu(relu_), zero_bn(zero_bn_) {
    reset();
  }
  void reset() override {
    conv = register_module("conv",
                           Conv2d(nn::Conv2dOptions(in, out, kernel).stride(stride).padding(kernel / 2).bias(false)));
    nn::BatchNorm2d bn(out);
    // The last BN of a residual branch starts at zero, so each block starts as the identity (as xresnet).
    if (zero_bn) nn::init::zeros_(bn->weight);
    register_module("bn", bn);  // held by the module tree only (see forward)
  }
  torch::Tensor forward(const torch::Tensor& x) {
    // The norm is called through the module tree, so that convert_sync_batchnorm can swap it.
    auto y = batch_norm_forward(*children()[1], conv->forward(x));
    return relu ? torch::relu(y) : y;
  }
  std::int64_t in, out, kernel, stride;
  bool relu, zero_bn;
  Conv2d conv{nullptr};
};
TORCH_MODULE(ConvBn);

struct ResBlockImpl : nn::Cloneable<ResBlockImpl> {
  ResBlockImpl(std::int64_t in_, std::int64_t out_, std::int64_t stride_) : in(in_), out(out_), stride(stride_) {
    reset();
  }
  void reset() override {
    branch = register_module("branch", nn::Sequential());
    shortcut = register_module("shortcut", nn::Sequential());
    branch->push_back(ConvBn(in, out, 3, stride, true));  // in order, as in simple_cnn
    branch->push_back(ConvBn(out, out, 3, 1, false, true));
    if (stride != 1) shortcut->push_back(AvgPool2d(nn::AvgPool2dOptions(stride).ceil_mode(true)));
    if (in != out) shortcut->push_back(ConvBn(in, out, 1, 1, false));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    auto identity = shortcut->is_empty() ? x : shortcut->forward(x);
    return torch::relu(branch->forward(x) + identity);
  }
  std::int64_t in, out, stride;
  nn::Sequential branch{nullptr}, shortcut{nullptr};
};
TORCH_MODULE(ResBlock);

}  // namespace

nn::Sequential resnet(const ResNetOptions& options) {
  if (options.widths.empty() || options.blocks_per_stage < 1 || options.classes < 1) {
    throw ConfigError("models::resnet: needs at least one stage width, blocks_per_stage >= 1 and classes >= 1");
  }
  nn::Sequential model;
  model->push_back(ConvBn(options.in_channels, options.stem_width, 3, 1, true));  // in order, as in simple_cnn
  model->push_back(ConvBn(options.stem_width, options.stem_width, 3, 1, true));
  std::int64_t channels = options.stem_width;
  for (std::size_t stage = 0; stage < options.widths.size(); ++stage) {
    for (std::int64_t b = 0; b < options.blocks_per_stage; ++b) {
      const std::int64_t stride = stage > 0 && b == 0 ? 2 : 1;
      model->push_back(ResBlock(channels, options.widths[stage], stride));
      channels = options.widths[stage];
    }
  }
  model->push_back(nn::AdaptiveAvgPool2d(1));
  model->push_back(Flatten());
  model->push_back(nn::Linear(channels, options.classes));
  return model;
}

std::vector<std::vector<at::Tensor>> body_head_split(torch::nn::Module& model) {
  const auto children = model.children();
  if (children.size() < 2) return {model.parameters()};
  auto head = children.back()->parameters();
  std::set<const void*> in_head;
  for (const auto& p : head) in_head.insert(p.unsafeGetTensorImpl());
  std::vector<at::Tensor> body;
  std::set<const void*> seen;
  for (std::size_t i = 0; i + 1 < children.size(); ++i) {
    for (auto& p : children[i]->parameters()) {
      // A weight shared with the head, or between layers, belongs to one group once.
      if (!in_head.contains(p.unsafeGetTensorImpl()) && seen.insert(p.unsafeGetTensorImpl()).second) body.push_back(p);
    }
  }
  return {body, head};
}

}  // namespace fastlearn::models
