#include <fastlearn/models/unet.h>

#include <fastlearn/core/error.h>
#include <fastlearn/models/detail/unet_layers.h>
#include <fastlearn/models/norm_layer.h>
#include <fastlearn/models/vision_model.h>
#include <fmt/format.h>
#include <torch/torch.h>

#include <algorithm>
#include <array>

namespace fastlearn::models {

namespace nn = torch::nn;

namespace {

constexpr int kBodyChildren = 8;  // torchvision's conv1, bn1, relu, maxpool, layer1 .. layer4

struct ChildShape {
  std::int64_t channels, height, width;
};

// The output shape of each of the body's children for an input of `size`: every stride-2 step (conv1 7x7 padded 3,
// the 3x3 max pool padded 1, the first block of layer2..4 with its 3x3 and its 1x1 shortcut) maps n to ceil(n / 2).
std::array<ChildShape, kBodyChildren> body_shapes(ImageSize size, int depth) {
  const std::int64_t expansion = depth == 50 ? 4 : 1;
  auto half = [](std::int64_t n) { return (n + 1) / 2; };
  std::array<ChildShape, kBodyChildren> shapes{};
  std::int64_t h = half(size.height), w = half(size.width);
  for (int child = 0; child < 3; ++child) shapes[child] = {64, h, w};
  h = half(h), w = half(w);
  shapes[3] = {64, h, w};
  for (int stage = 0; stage < 4; ++stage) {
    if (stage > 0) h = half(h), w = half(w);
    shapes[4 + stage] = {(std::int64_t{64} << stage) * expansion, h, w};
  }
  return shapes;
}

}  // namespace

UnetImpl::UnetImpl(UnetOptions options) : options_(std::move(options)) {
  const auto& o = options_;
  torchvision_resnet_depth(o.arch);  // ConfigError naming the choices
  if (o.classes < 1 || o.in_channels < 1) {
    throw ConfigError(fmt::format("unet: classes {} and in_channels {} must be at least 1", o.classes, o.in_channels));
  }
  if (o.image_size.height < 1 || o.image_size.width < 1) {
    throw ConfigError(
        fmt::format("unet: image_size {}x{} must be set to the training images' height and width (it decides the skip "
                    "connections)",
                    o.image_size.height, o.image_size.width));
  }
  if (o.y_range && !(o.y_range->first < o.y_range->second)) {
    throw ConfigError(fmt::format("unet: y_range ({}, {}) needs low < high", o.y_range->first, o.y_range->second));
  }
  reset();
}

void UnetImpl::reset() {
  const auto& o = options_;
  const int depth = torchvision_resnet_depth(o.arch);
  const auto shapes = body_shapes(o.image_size, depth);
  register_module(
      "0", TorchvisionResNet(TorchvisionResNetOptions{.depth = depth, .head = false, .in_channels = o.in_channels}));
  // fastai keeps the children after which the width changes (the width alone, as fastai compares), deepest first.
  skips_.clear();
  for (int child = kBodyChildren - 2; child >= 0; --child) {
    if (shapes[child].width != shapes[child + 1].width) skips_.push_back(child);
  }
  const auto width = shapes[kBodyChildren - 1].channels;
  register_module("1", detail::fastai_batch_norm(width));
  // "2" is fastai's ReLU, which holds nothing.
  SequentialBlock middle;
  middle->push_back(detail::conv_layer(width, 2 * width, 3, /*relu=*/true));
  middle->push_back(detail::conv_layer(2 * width, width, 3, /*relu=*/true));
  register_module("3", middle);
  int index = 4;
  std::int64_t channels = width;
  blocks_.clear();
  for (std::size_t i = 0; i < skips_.size(); ++i) {
    const bool last = i + 1 == skips_.size();
    detail::UnetBlock block(channels, shapes[skips_[i]].channels, /*final_div=*/!last,
                            o.blur && (!last || o.blur_final));
    channels = block->out_channels();
    blocks_.push_back(std::to_string(index++));
    register_module(blocks_.back(), block);
  }
  // fastai compares the input's size with conv1's output: different for any input larger than 1x1.
  final_shuffle_ = ImageSize{shapes[0].height, shapes[0].width} != o.image_size;
  shuffle_.clear();
  if (final_shuffle_) {
    shuffle_ = std::to_string(index++);
    register_module(shuffle_, detail::pixel_shuffle_icnr(channels, channels, /*blur=*/false));
  }
  ++index;  // fastai's ResizeToOrig
  cross_block_.clear();
  if (o.last_cross) {
    ++index;  // fastai's MergeLayer
    channels += o.in_channels;
    cross_block_ = std::to_string(index++);
    register_module(cross_block_, detail::ResBlock(channels));
  }
  head_ = std::to_string(index);
  auto head = detail::conv_layer(channels, o.classes, 1, /*relu=*/false);
  register_module(head_, head);
  detail::kaiming_normal_convolutions(*middle);
  if (o.last_cross) detail::kaiming_normal_convolutions(*named_children()[cross_block_]);
}

at::Tensor UnetImpl::forward(const at::Tensor& x) {
  const auto children = named_children();
  auto sequential = [&](const std::string& name) { return children[name]->as<nn::SequentialImpl>(); };
  std::array<at::Tensor, kBodyChildren> kept;
  auto y = children["0"]->as<TorchvisionResNetImpl>()->features(x, [&](int child, const at::Tensor& output) {
    if (std::find(skips_.begin(), skips_.end(), child) != skips_.end()) kept[child] = output;
  });
  y = sequential("3")->forward(torch::relu(batch_norm_forward(*children["1"], y)));
  for (std::size_t i = 0; i < blocks_.size(); ++i) {
    y = children[blocks_[i]]->as<detail::UnetBlockImpl>()->forward(y, kept[skips_[i]]);
    kept[skips_[i]] = at::Tensor();
  }
  if (final_shuffle_) y = sequential(shuffle_)->forward(y);
  if (y.size(-2) != x.size(-2) || y.size(-1) != x.size(-1)) y = at::upsample_nearest2d(y, {x.size(-2), x.size(-1)});
  if (!cross_block_.empty()) y = children[cross_block_]->as<detail::ResBlockImpl>()->forward(torch::cat({y, x}, 1));
  y = sequential(head_)->forward(y);
  if (options_.y_range) {
    const auto [low, high] = *options_.y_range;
    y = torch::sigmoid(y) * (high - low) + low;
  }
  return y;
}

Unet unet(const UnetOptions& options) {
  Unet model(options);
  if (!options.weights.empty()) load_torchvision_body(*model->named_children()["0"], options.weights);
  return model;
}

}  // namespace fastlearn::models
