#include <fastlearn/models/torchvision_resnet.h>

#include <fastlearn/core/detail/text.h>
#include <fastlearn/core/error.h>
#include <fastlearn/models/norm_layer.h>
#include <fmt/format.h>
#include <torch/torch.h>

#include <array>

namespace fastlearn::models {

namespace nn = torch::nn;

namespace {

// models::Conv2d: torch's convolution, with the weight gradient by patches where its rule says so.
Conv2d conv(std::int64_t in, std::int64_t out, std::int64_t kernel, std::int64_t stride) {
  return Conv2d(nn::Conv2dOptions(in, out, kernel).stride(stride).padding(kernel / 2).bias(false));
}

// A residual block: BasicBlock (two 3x3) or Bottleneck (1x1, 3x3 with the stride, 1x1 to 4x width). The
// children are registered in torchvision's order; forward reaches them through children(), so that the
// BatchNorms can be swapped (convert_sync_batchnorm).
class BlockImpl : public nn::Cloneable<BlockImpl> {
 public:
  BlockImpl(std::int64_t in, std::int64_t width, std::int64_t stride, bool bottleneck)
      : in_(in), width_(width), stride_(stride), bottleneck_(bottleneck) {
    reset();
  }

  void reset() override {
    const std::int64_t out = bottleneck_ ? width_ * 4 : width_;
    if (bottleneck_) {
      register_module("conv1", conv(in_, width_, 1, 1));
      register_module("bn1", nn::BatchNorm2d(width_));
      register_module("conv2", conv(width_, width_, 3, stride_));
      register_module("bn2", nn::BatchNorm2d(width_));
      register_module("conv3", conv(width_, out, 1, 1));
      register_module("bn3", nn::BatchNorm2d(out));
    } else {
      register_module("conv1", conv(in_, width_, 3, stride_));
      register_module("bn1", nn::BatchNorm2d(width_));
      register_module("conv2", conv(width_, width_, 3, 1));
      register_module("bn2", nn::BatchNorm2d(width_));
    }
    has_downsample_ = stride_ != 1 || in_ != out;
    if (has_downsample_)
      register_module("downsample", nn::Sequential(conv(in_, out, 1, stride_), nn::BatchNorm2d(out)));
  }

  at::Tensor forward(const at::Tensor& x) {
    const auto c = children();
    auto conv_at = [&](std::size_t i, const at::Tensor& t) { return c[i]->as<Conv2dImpl>()->forward(t); };
    const std::size_t convs = bottleneck_ ? 3 : 2;
    auto y = x;
    for (std::size_t k = 0; k < convs; ++k) {
      y = batch_norm_forward(*c[2 * k + 1], conv_at(2 * k, y));
      if (k + 1 < convs) y = torch::relu(y);
    }
    const auto identity = has_downsample_ ? c[2 * convs]->as<nn::SequentialImpl>()->forward(x) : x;
    return torch::relu(y + identity);
  }

 private:
  std::int64_t in_, width_, stride_;
  bool bottleneck_;
  bool has_downsample_ = false;
};
TORCH_MODULE(Block);

}  // namespace

TorchvisionResNetImpl::TorchvisionResNetImpl(const TorchvisionResNetOptions& options)
    : options_(options), depth_(options.depth) {
  if (options.depth != 18 && options.depth != 34 && options.depth != 50) {
    throw ConfigError(fmt::format("models: torchvision ResNet depth {} is not one of 18, 34, 50", options.depth));
  }
  if (options.classes < 1) throw ConfigError(fmt::format("models: {} classes; need at least 1", options.classes));
  if (options.in_channels < 1) {
    throw ConfigError(fmt::format("models: {} input channels; need at least 1", options.in_channels));
  }
  reset();
}

void TorchvisionResNetImpl::reset() {
  const auto& options = options_;
  const bool bottleneck = options.depth == 50;
  const std::array<std::int64_t, 4> blocks =
      options.depth == 18 ? std::array<std::int64_t, 4>{2, 2, 2, 2} : std::array<std::int64_t, 4>{3, 4, 6, 3};
  conv1_ =
      register_module("conv1", Conv2d(nn::Conv2dOptions(options.in_channels, 64, 7).stride(2).padding(3).bias(false)));
  register_module("bn1", nn::BatchNorm2d(64));
  std::int64_t in = 64;
  for (int stage = 0; stage < 4; ++stage) {
    const std::int64_t width = std::int64_t{64} << stage;
    layers_[stage] = nn::Sequential();
    for (std::int64_t b = 0; b < blocks[static_cast<std::size_t>(stage)]; ++b) {
      const std::int64_t stride = stage > 0 && b == 0 ? 2 : 1;
      layers_[stage]->push_back(Block(in, width, stride, bottleneck));
      in = bottleneck ? width * 4 : width;
    }
    register_module(fmt::format("layer{}", stage + 1), layers_[stage]);
  }
  feature_channels_ = in;
  if (options.head) fc_ = register_module("fc", nn::Linear(in, options.classes));
  // torchvision's initialization: Kaiming normal (fan_out, ReLU) convolutions, BatchNorm 1 and 0; fc keeps
  // nn.Linear's default.
  for (auto& module : modules(/*include_self=*/false)) {
    if (auto* c = module->as<nn::Conv2dImpl>()) {
      nn::init::kaiming_normal_(c->weight, 0, torch::kFanOut, torch::kReLU);
    } else if (auto* bn = module->as<nn::BatchNorm2dImpl>()) {
      nn::init::ones_(bn->weight);
      nn::init::zeros_(bn->bias);
    }
  }
}

at::Tensor TorchvisionResNetImpl::features(const at::Tensor& x) { return features(x, {}); }

at::Tensor TorchvisionResNetImpl::features(const at::Tensor& x,
                                           const std::function<void(int child, const at::Tensor& output)>& tap) {
  auto show = [&](int child, const at::Tensor& y) {
    if (tap) tap(child, y);
  };
  auto y = conv1_->forward(x);
  show(0, y);
  y = batch_norm_forward(*children()[1], y);
  show(1, y);
  y = torch::relu(y);
  show(2, y);
  y = torch::max_pool2d(y, 3, 2, 1);
  show(3, y);
  for (int stage = 0; stage < 4; ++stage) {
    y = layers_[stage]->forward(y);
    show(4 + stage, y);
  }
  return y;
}

at::Tensor TorchvisionResNetImpl::forward(const at::Tensor& x) {
  if (!fc_) return features(x);
  return fc_->forward(torch::adaptive_avg_pool2d(features(x), {1, 1}).flatten(1));
}

TorchvisionResNet resnet18(std::int64_t classes) { return TorchvisionResNet(TorchvisionResNetOptions{18, classes}); }
TorchvisionResNet resnet34(std::int64_t classes) { return TorchvisionResNet(TorchvisionResNetOptions{34, classes}); }
TorchvisionResNet resnet50(std::int64_t classes) { return TorchvisionResNet(TorchvisionResNetOptions{50, classes}); }

int torchvision_resnet_depth(const std::string& arch) {
  if (arch == "resnet18") return 18;
  if (arch == "resnet34") return 34;
  if (arch == "resnet50") return 50;
  throw ConfigError(fmt::format("models: architecture '{}' is not one of resnet18, resnet34, resnet50", excerpt(arch)));
}

TorchvisionResNet torchvision_resnet(const std::string& arch, std::int64_t classes) {
  return TorchvisionResNet(TorchvisionResNetOptions{.depth = torchvision_resnet_depth(arch), .classes = classes});
}

}  // namespace fastlearn::models
