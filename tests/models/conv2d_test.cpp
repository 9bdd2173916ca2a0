// models::Conv2d against torch::nn::Conv2d with the same parameters: the same output and the same input,
// weight and bias gradients (to float32 rounding) where it computes the weight gradient by patches, in both
// memory formats, with and without bias, for strides, paddings and kernels of both shapes, in chunks of the
// batch; the one-input-channel kernels of a channels-last grey-image model against torch, their bits alike on 1
// and 2 threads; the direct kernels for channel counts of 16s likewise, in every instruction set; torch's own
// path where the rules or the tensors do not fit; clones that stay models::Conv2d.
#include <ATen/autocast_mode.h>
#include <fastlearn/core/error.h>
#include <fastlearn/models/conv2d.h>
#include <fastlearn/models/detail/direct_conv.h>
#include <fastlearn/models/detail/direct_conv2d.h>
#include <fastlearn/models/detail/one_channel_conv.h>
#include <fastlearn/models/memory_format.h>
#include <fastlearn/models/models.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdlib>
#include <string>

namespace fl = fastlearn;
namespace nn = torch::nn;

namespace {

double relative_error(const at::Tensor& a, const at::Tensor& b) {
  return (a - b).abs().max().item<double>() / std::max(1e-12, b.abs().max().item<double>());
}

struct Grads {
  at::Tensor output, input, weight, bias;
  std::string grad_fn;
};

// One forward and backward of `conv` on `x` with a fixed upstream gradient.
template <typename Module>
Grads run(Module& conv, const at::Tensor& x_in, const at::Tensor& upstream) {
  auto x = x_in.detach().clone(x_in.suggest_memory_format()).requires_grad_(true);
  conv->zero_grad();
  auto y = conv->forward(x);
  (y * upstream).sum().backward();
  return {y.detach(), x.grad(), conv->weight.grad(), conv->bias.defined() ? conv->bias.grad() : at::Tensor(),
          y.grad_fn() ? y.grad_fn()->name() : std::string()};
}

// Which code models::Conv2d runs, told by the autograd function of its output.
enum class Path { torch, patches, one_channel, direct };

std::string function_name(Path path) {
  switch (path) {
    case Path::patches:
      return "ConvWithPatchWeightGrad";
    case Path::one_channel:
      return "OneChannelConvFunction";
    case Path::direct:
      return "DirectConvFunction";
    case Path::torch:
      break;
  }
  return "ConvolutionBackward0";
}

// A models::Conv2d and a torch::nn::Conv2d with the same options and weights, run on the same batch.
void expect_same_as_torch(const nn::Conv2dOptions& options, std::vector<std::int64_t> input_shape, bool channels_last,
                          Path expected_path) {
  torch::manual_seed(1);
  fl::models::Conv2d ours(options);
  nn::Conv2d reference(options);
  {
    torch::NoGradGuard no_grad;
    reference->weight.copy_(ours->weight);
    if (ours->bias.defined()) reference->bias.copy_(ours->bias);
  }
  auto x = torch::randn(input_shape);
  if (channels_last) {
    x = x.contiguous(at::MemoryFormat::ChannelsLast);
    fl::models::to_channels_last(*ours);
    fl::models::to_channels_last(*reference);
  }
  auto upstream = torch::randn_like(reference->forward(x).detach());
  const auto a = run(ours, x, upstream), b = run(reference, x, upstream);
  EXPECT_NE(a.grad_fn.find(function_name(expected_path)), std::string::npos) << a.grad_fn;
  // The direct kernels sum the output and the input gradient in another order than oneDNN: a sum of 1,152 terms
  // (128 channels x 9 taps) differs by up to about 2e-6 of its largest value.
  const double tolerance = expected_path == Path::direct ? 5e-6 : 1e-6;
  EXPECT_LT(relative_error(a.output, b.output), tolerance);
  EXPECT_LT(relative_error(a.input, b.input), tolerance);
  EXPECT_LT(relative_error(a.weight, b.weight), 1e-5);
  EXPECT_EQ(a.weight.sizes(), b.weight.sizes());
  if (b.bias.defined()) {
    EXPECT_LT(relative_error(a.bias, b.bias), 1e-5);
  }
}

TEST(Conv2d, SmallFeatureMapsWithManyChannelsGetTheSameGradientsAsTorch) {
  // conv_net's last layer's shape (4x4 -> 2x2) with 136 channels, which the direct kernels (multiples of 16) do
  // not take, in both formats, with and without bias.
  for (const bool channels_last : {false, true}) {
    for (const bool bias : {false, true}) {
      SCOPED_TRACE(std::to_string(channels_last) + std::to_string(bias));
      expect_same_as_torch(nn::Conv2dOptions(136, 136, 3).stride(2).padding(1).bias(bias), {6, 136, 4, 4},
                           channels_last, Path::patches);
    }
  }
}

TEST(Conv2d, StridesPaddingsAndKernelsOfEitherShapeMatchTorch) {
  expect_same_as_torch(nn::Conv2dOptions(136, 136, 3).stride(1).padding(0), {5, 136, 5, 6}, true, Path::patches);
  expect_same_as_torch(nn::Conv2dOptions(136, 136, {3, 1}).stride({2, 1}).padding({1, 0}), {3, 136, 6, 3}, false,
                       Path::patches);
  expect_same_as_torch(nn::Conv2dOptions(136, 136, {1, 2}).stride(2), {4, 136, 7, 7}, true, Path::patches);
  expect_same_as_torch(nn::Conv2dOptions(136, 136, {2, 3}).stride({1, 2}).padding({0, 2}), {2, 136, 3, 4}, false,
                       Path::patches);
  // Kernel offsets that fall entirely in the padding for some or all output pixels.
  expect_same_as_torch(nn::Conv2dOptions(136, 136, 3).stride(2).padding(1), {2, 136, 1, 1}, true, Path::patches);
  expect_same_as_torch(nn::Conv2dOptions(136, 136, 3).padding(2), {2, 136, 1, 2}, true, Path::patches);
  expect_same_as_torch(nn::Conv2dOptions(136, 136, 5).stride(3).padding(2), {2, 136, 7, 4}, false, Path::patches);
}

TEST(Conv2d, OtherShapesAndTensorsTakeTorchsPath) {
  // Too few input channels for the rule; too few output channels; too large an output map; a pointwise kernel;
  // groups; dilation; float64.
  expect_same_as_torch(nn::Conv2dOptions(72, 136, 3).stride(2).padding(1), {4, 72, 8, 8}, false, Path::torch);
  expect_same_as_torch(nn::Conv2dOptions(136, 136, 3).padding(1), {2, 136, 5, 5}, true, Path::torch);
  expect_same_as_torch(nn::Conv2dOptions(136, 72, 3).padding(1), {2, 136, 4, 4}, true, Path::torch);
  expect_same_as_torch(nn::Conv2dOptions(136, 136, 1), {2, 136, 4, 4}, true, Path::torch);
  expect_same_as_torch(nn::Conv2dOptions(136, 136, 3).groups(2).padding(1), {2, 136, 4, 4}, false, Path::torch);
  expect_same_as_torch(nn::Conv2dOptions(136, 136, 3).dilation(2).padding(2), {2, 136, 4, 4}, false, Path::torch);
  torch::manual_seed(0);
  fl::models::Conv2d conv(nn::Conv2dOptions(136, 136, 3).padding(1));
  conv->to(torch::kFloat64);
  auto y = conv->forward(torch::randn({2, 136, 4, 4}, torch::kFloat64));
  EXPECT_EQ(y.grad_fn()->name(), "ConvolutionBackward0");
  {
    torch::NoGradGuard no_grad;
    EXPECT_EQ(conv->forward(torch::randn({2, 136, 4, 4}, torch::kFloat64)).grad_fn(), nullptr);
  }
}

TEST(Conv2d, TheEnvironmentSwitchesThePatchProductOffAndRefusesOtherValues) {
  const auto options = nn::Conv2dOptions(136, 136, 3).padding(1);
  expect_same_as_torch(options, {2, 136, 4, 4}, true, Path::patches);
  setenv("FASTLEARN_CONV_PATCH_GRAD", "0", 1);
  expect_same_as_torch(options, {2, 136, 4, 4}, true, Path::torch);
  setenv("FASTLEARN_CONV_PATCH_GRAD", "off", 1);
  fl::models::Conv2d conv(options);
  EXPECT_THROW(conv->forward(torch::randn({1, 136, 3, 3})), fl::ConfigError);
  setenv("FASTLEARN_CONV_PATCH_GRAD", "1", 1);
  expect_same_as_torch(options, {2, 136, 4, 4}, true, Path::patches);
  unsetenv("FASTLEARN_CONV_PATCH_GRAD");
}

TEST(Conv2d, OneInputChannelInAChannelsLastModelRunsItsOwnKernelsAndMatchesTorch) {
  // simple_cnn's first layer, other strides and paddings, odd sizes, channel counts that leave blocks of 8 and 16
  // after the widest blocks (24 = 16 + 8, 40 = 32 + 8), with and without bias. The input gradient (torch's) is
  // checked too, since run() asks for it.
  expect_same_as_torch(nn::Conv2dOptions(1, 32, 3).stride(2).padding(1), {5, 1, 28, 28}, true, Path::one_channel);
  for (const bool bias : {false, true}) {
    SCOPED_TRACE(bias);
    expect_same_as_torch(nn::Conv2dOptions(1, 24, 3).padding(1).bias(bias), {3, 1, 9, 7}, true, Path::one_channel);
    expect_same_as_torch(nn::Conv2dOptions(1, 40, 3).bias(bias), {2, 1, 5, 6}, true, Path::one_channel);
    expect_same_as_torch(nn::Conv2dOptions(1, 8, 3).stride({2, 1}).padding({0, 2}).bias(bias), {2, 1, 8, 3}, true,
                         Path::one_channel);
    expect_same_as_torch(nn::Conv2dOptions(1, 16, 3).stride(3).padding(1).bias(bias), {1, 1, 1, 1}, true,
                         Path::one_channel);
  }
  // The same layer in a contiguous model, other kernels and channel counts keep torch's kernels.
  expect_same_as_torch(nn::Conv2dOptions(1, 32, 3).stride(2).padding(1), {4, 1, 28, 28}, false, Path::torch);
  expect_same_as_torch(nn::Conv2dOptions(1, 32, 5).padding(2), {2, 1, 9, 9}, true, Path::torch);
  expect_same_as_torch(nn::Conv2dOptions(1, 12, 3).padding(1), {2, 1, 9, 9}, true, Path::torch);
  expect_same_as_torch(nn::Conv2dOptions(1, 32, 3).dilation(2).padding(2), {2, 1, 9, 9}, true, Path::torch);
}

TEST(Conv2d, OneInputChannelWithoutGradientsGivesTorchsOutput) {
  torch::manual_seed(0);
  fl::models::Conv2d ours(nn::Conv2dOptions(1, 32, 3).stride(2).padding(1));
  fl::models::to_channels_last(*ours);
  const auto x = fl::models::as_channels_last(torch::randn({6, 1, 28, 28}));
  torch::NoGradGuard no_grad;
  const auto y = ours->forward(x);
  EXPECT_EQ(y.grad_fn(), nullptr);
  EXPECT_TRUE(y.is_contiguous(at::MemoryFormat::ChannelsLast));
  EXPECT_LT(relative_error(y, at::conv2d(x, ours->weight, ours->bias, 2, 1)), 1e-6);
}

TEST(Conv2d, OneInputChannelGradientsHaveTheSameBitsOnOneAndTwoThreads) {
  const int threads_before = at::get_num_threads();
  torch::manual_seed(0);
  fl::models::Conv2d conv(nn::Conv2dOptions(1, 32, 3).stride(2).padding(1));
  fl::models::to_channels_last(*conv);
  const auto x =
      fl::models::as_channels_last(torch::randn({37, 1, 28, 28}));  // 37 images: a last chunk of rows cut short
  const auto upstream = torch::randn({37, 32, 14, 14}).contiguous(at::MemoryFormat::ChannelsLast);
  std::vector<Grads> results;
  for (const int threads : {1, 2}) {
    at::set_num_threads(threads);
    results.push_back(run(conv, x, upstream));
  }
  at::set_num_threads(threads_before);
  EXPECT_NE(results[0].grad_fn.find("OneChannelConvFunction"), std::string::npos) << results[0].grad_fn;
  EXPECT_TRUE(torch::equal(results[0].output, results[1].output));
  EXPECT_TRUE(torch::equal(results[0].weight, results[1].weight));
  EXPECT_TRUE(torch::equal(results[0].bias, results[1].bias));
}

TEST(Conv2d, TheEnvironmentSwitchesTheOneChannelKernelsOffAndRefusesOtherValues) {
  const auto options = nn::Conv2dOptions(1, 32, 3).stride(2).padding(1);
  setenv("FASTLEARN_ONE_CHANNEL_CONV", "0", 1);
  expect_same_as_torch(options, {2, 1, 12, 12}, true, Path::torch);
  setenv("FASTLEARN_ONE_CHANNEL_CONV", "yes", 1);
  fl::models::Conv2d conv(options);
  fl::models::to_channels_last(*conv);
  EXPECT_THROW(conv->forward(fl::models::as_channels_last(torch::randn({1, 1, 5, 5}))), fl::ConfigError);
  unsetenv("FASTLEARN_ONE_CHANNEL_CONV");
  expect_same_as_torch(options, {2, 1, 12, 12}, true, Path::one_channel);
}

TEST(Conv2d, OneChannelRuleTakesThreeByThreeKernelsWithAMultipleOfEightOutputsInChannelsLast) {
  EXPECT_TRUE(fl::models::uses_one_channel_kernels(1, 32, 3, 3, true));
  EXPECT_TRUE(fl::models::uses_one_channel_kernels(1, 8, 3, 3, true));
  EXPECT_FALSE(fl::models::uses_one_channel_kernels(1, 32, 3, 3, false));  // a contiguous model
  EXPECT_FALSE(fl::models::uses_one_channel_kernels(3, 32, 3, 3, true));   // RGB
  EXPECT_FALSE(fl::models::uses_one_channel_kernels(1, 20, 3, 3, true));
  EXPECT_FALSE(fl::models::uses_one_channel_kernels(1, 32, 5, 5, true));
}

// A channels-last 1 -> 32 layer and a torch::nn::Conv2d with the same weights, for the cases below.
struct OneChannelPair {
  fl::models::Conv2d ours{nn::Conv2dOptions(1, 32, 3).stride(2).padding(1)};
  nn::Conv2d reference{nn::Conv2dOptions(1, 32, 3).stride(2).padding(1)};
  OneChannelPair() {
    torch::NoGradGuard no_grad;
    reference->weight.copy_(ours->weight);
    reference->bias.copy_(ours->bias);
    fl::models::to_channels_last(*ours);
    fl::models::to_channels_last(*reference);
  }
};

TEST(Conv2d, OneInputChannelHandlesEmptyBatchesStridedViewsAndPartialGradients) {
  torch::manual_seed(0);
  OneChannelPair pair;
  // An empty batch, and a strided view of a larger batch.
  const auto big = torch::randn({4, 1, 56, 57});
  for (const auto& x : {torch::randn({0, 1, 28, 28}), big.slice(2, 0, std::nullopt, 2).slice(3, 1, std::nullopt, 2)}) {
    const auto upstream = torch::randn({x.size(0), 32, 14, 14});
    const auto a = run(pair.ours, x, upstream), b = run(pair.reference, x, upstream);
    EXPECT_NE(a.grad_fn.find("OneChannelConvFunction"), std::string::npos) << a.grad_fn;
    EXPECT_EQ(a.output.sizes(), b.output.sizes());
    EXPECT_TRUE(torch::allclose(a.output, b.output, 1e-5, 1e-5));
    EXPECT_TRUE(torch::allclose(a.weight, b.weight, 1e-4, 1e-3));  // sums over the batch: zeros for none
    EXPECT_TRUE(torch::allclose(a.bias, b.bias, 1e-4, 1e-3));
  }
  // Only the input needs a gradient (a frozen layer), or only the bias.
  const auto x = fl::models::as_channels_last(torch::randn({3, 1, 28, 28}));
  pair.ours->zero_grad();
  pair.reference->zero_grad();
  pair.ours->weight.requires_grad_(false);
  pair.ours->bias.requires_grad_(false);
  auto input = x.clone().requires_grad_(true);
  pair.ours->forward(input).sum().backward();
  auto reference_input = x.clone().requires_grad_(true);
  pair.reference->forward(reference_input).sum().backward();
  EXPECT_LT(relative_error(input.grad(), reference_input.grad()), 1e-6);
  EXPECT_FALSE(pair.ours->weight.grad().defined());
  pair.ours->bias.requires_grad_(true);
  pair.reference->zero_grad();
  pair.ours->forward(x).sum().backward();
  pair.reference->forward(x).sum().backward();
  EXPECT_LT(relative_error(pair.ours->bias.grad(), pair.reference->bias.grad()), 1e-5);
  EXPECT_FALSE(pair.ours->weight.grad().defined());
  // Inference mode: the kernels' forward, no graph.
  pair.ours->weight.requires_grad_(true);
  const c10::InferenceMode inference;
  EXPECT_LT(relative_error(pair.ours->forward(x), pair.reference->forward(x)), 1e-6);
}

TEST(Conv2d, OneInputChannelSecondDerivativesAreTorchs) {
  // A gradient penalty: the weight gradient made with create_graph and differentiated again.
  torch::manual_seed(0);
  OneChannelPair pair;
  const auto x = fl::models::as_channels_last(torch::randn({3, 1, 12, 12}));
  std::vector<at::Tensor> second;
  for (auto* conv : {static_cast<nn::Module*>(pair.ours.get()), static_cast<nn::Module*>(pair.reference.get())}) {
    auto weight = conv->named_parameters()["weight"];
    const auto y = conv == pair.ours.get() ? pair.ours->forward(x) : pair.reference->forward(x);
    const auto grad = torch::autograd::grad({y.pow(2).sum()}, {weight}, {}, true, true)[0];
    weight.mutable_grad() = at::Tensor();
    grad.pow(2).sum().backward();
    second.push_back(weight.grad().clone());
  }
  EXPECT_LT(relative_error(second[0], second[1]), 1e-4);
}

TEST(Conv2d, OneInputChannelRefusesWhatTorchRefuses) {
  // A channels-last 3-channel layer given grey images, a zero stride: torch's errors, not the kernels' numbers.
  torch::manual_seed(0);
  fl::models::Conv2d rgb(nn::Conv2dOptions(3, 32, 3).padding(1));
  fl::models::to_channels_last(*rgb);
  EXPECT_THROW(rgb->forward(torch::randn({2, 1, 8, 8})), c10::Error);
  fl::models::Conv2d zero_stride(nn::Conv2dOptions(1, 32, 3).stride(0));
  fl::models::to_channels_last(*zero_stride);
  EXPECT_THROW(zero_stride->forward(torch::randn({2, 1, 8, 8})), c10::Error);
}

TEST(Conv2d, OneChannelKernelsOfEveryInstructionSetAgree) {
  // The AVX-512, AVX2 and plain variants (where this CPU runs them) on the same images: 40 output channels
  // leave a tail after every variant's widest block.
  torch::manual_seed(0);
  const std::int64_t images = 3, out_channels = 40;
  const auto padded = torch::randn({images, 11, 10});  // 9x8 images with a border of 1
  const auto taps = torch::randn({3, 3, out_channels});
  const auto bias = torch::randn({out_channels});
  const fl::models::OneChannelConv c{.padded_height = 11,
                                     .padded_width = 10,
                                     .out_height = 5,
                                     .out_width = 4,
                                     .out_channels = 40,
                                     .stride_h = 2,
                                     .stride_w = 2};
  const auto grad = torch::randn({images, c.out_height, c.out_width, out_channels});
  std::vector<at::Tensor> outs, sums;
  for (const auto isa : {fl::models::KernelIsa::widest, fl::models::KernelIsa::avx2, fl::models::KernelIsa::baseline}) {
    auto out = torch::empty({images, c.out_height, c.out_width, out_channels});
    auto sum = torch::empty({10 * out_channels});
    fl::models::one_channel_conv_forward(c, padded.data_ptr<float>(), taps.data_ptr<float>(), bias.data_ptr<float>(),
                                         out.data_ptr<float>(), 0, images * c.out_height, isa);
    fl::models::one_channel_conv_weight_grad(c, padded.data_ptr<float>(), grad.data_ptr<float>(), sum.data_ptr<float>(),
                                             0, images * c.out_height, isa);
    outs.push_back(out);
    sums.push_back(sum);
  }
  const auto weight = taps.permute({2, 0, 1}).unsqueeze(1);  // (O, 1, 3, 3)
  const auto expected = at::conv2d(padded.unsqueeze(1), weight, bias, 2).permute({0, 2, 3, 1});
  const auto expected_weight_grad =
      std::get<1>(at::convolution_backward(grad.permute({0, 3, 1, 2}), padded.unsqueeze(1), weight, std::nullopt,
                                           {2, 2}, {0, 0}, {1, 1}, false, {0, 0}, 1, {false, true, false}));
  for (std::size_t i = 0; i < outs.size(); ++i) {
    SCOPED_TRACE(i);
    EXPECT_LT(relative_error(outs[i], expected), 1e-6);
    EXPECT_LT(relative_error(sums[i].narrow(0, 0, 9 * out_channels).view({3, 3, out_channels}),
                             expected_weight_grad.squeeze(1).permute({1, 2, 0})),
              1e-5);
    EXPECT_LT(relative_error(sums[i].narrow(0, 9 * out_channels, out_channels), grad.sum({0, 1, 2})), 1e-5);
  }
}

TEST(Conv2d, UnderBfloat16AutocastItIsTorchsConvolution) {
  torch::manual_seed(0);
  fl::models::Conv2d conv(nn::Conv2dOptions(128, 128, 3).padding(1));
  at::autocast::set_autocast_enabled(at::kCPU, true);
  at::autocast::set_autocast_dtype(at::kCPU, at::kBFloat16);
  auto y = conv->forward(torch::randn({2, 128, 4, 4}));
  at::autocast::set_autocast_enabled(at::kCPU, false);
  at::autocast::clear_cache();
  EXPECT_EQ(y.scalar_type(), at::kBFloat16);
  y.sum().backward();
  EXPECT_TRUE(conv->weight.grad().defined());
}

TEST(Conv2d, WeightGradientIsTheSameInAnyNumberOfChunks) {
  torch::manual_seed(0);
  auto x = torch::randn({7, 64, 5, 5}).contiguous(at::MemoryFormat::ChannelsLast);
  auto grad = torch::randn({7, 32, 3, 3});
  const auto whole = fl::models::conv2d_weight_grad_by_patches(grad, x, {3, 3}, {2, 2}, {1, 1});
  const auto expected =
      std::get<1>(at::convolution_backward(grad, x, torch::zeros({32, 64, 3, 3}), std::nullopt, {2, 2}, {1, 1}, {1, 1},
                                           false, {0, 0}, 1, {false, true, false}));
  EXPECT_LT(relative_error(whole, expected), 1e-5);
  for (const std::int64_t budget : {1, 9 * 576, 3 * 9 * 576}) {  // 1 image per chunk, exactly 1, 3 (7 = 3+3+1)
    EXPECT_LT(relative_error(fl::models::conv2d_weight_grad_by_patches(grad, x, {3, 3}, {2, 2}, {1, 1}, budget), whole),
              1e-6)
        << budget;
  }
}

TEST(Conv2d, RuleTakesDeepLayersOnSmallMapsWithKernelsLargerThanOnePixel) {
  EXPECT_TRUE(fl::models::uses_patch_weight_grad(128, 256, 3, 3, 4));   // conv_net's last layer: 2x2
  EXPECT_TRUE(fl::models::uses_patch_weight_grad(512, 512, 3, 3, 16));  // resnet18's last stage at 128 px
  EXPECT_TRUE(fl::models::uses_patch_weight_grad(512, 512, 1, 2, 1));
  EXPECT_FALSE(fl::models::uses_patch_weight_grad(64, 128, 3, 3, 16));   // too few input channels
  EXPECT_FALSE(fl::models::uses_patch_weight_grad(128, 64, 3, 3, 4));    // too few output channels
  EXPECT_FALSE(fl::models::uses_patch_weight_grad(512, 512, 3, 3, 49));  // too large a map
  EXPECT_FALSE(fl::models::uses_patch_weight_grad(256, 256, 1, 1, 4));   // pointwise
  EXPECT_TRUE(fl::models::uses_patch_weight_grad(
      64, 64, 3, 3, 49, {.min_in_channels = 64, .min_out_channels = 64, .max_output_pixels = 49}));
}

TEST(Conv2d, CloneStaysAModelsConv2dWithItsOwnCopyOfTheWeights) {
  auto model = fl::models::conv_net();
  auto copy = std::dynamic_pointer_cast<nn::SequentialImpl>(model->clone());
  ASSERT_NE(copy, nullptr);
  auto original_conv = (*model)[0]->as<fl::models::Conv2dImpl>();
  auto copied_conv = (*copy)[0]->as<fl::models::Conv2dImpl>();
  ASSERT_NE(original_conv, nullptr);
  ASSERT_NE(copied_conv, nullptr);
  EXPECT_TRUE(torch::equal(original_conv->weight, copied_conv->weight));
  EXPECT_NE(original_conv->weight.data_ptr(), copied_conv->weight.data_ptr());
  EXPECT_EQ(copied_conv->named_parameters().keys(), std::vector<std::string>{"weight"});
}

TEST(Conv2d, ChannelCountsOfSixteensRunTheDirectKernelsAndMatchTorch) {
  // simple_cnn's and conv_net's layers in both formats, with and without bias; channel counts that take each
  // block width of the kernels (64: 4 vectors of 16, 32: 2, 16 and 48: 1).
  for (const bool channels_last : {false, true}) {
    for (const bool bias : {false, true}) {
      SCOPED_TRACE(std::to_string(channels_last) + std::to_string(bias));
      expect_same_as_torch(nn::Conv2dOptions(32, 64, 3).stride(2).padding(1).bias(bias), {5, 32, 14, 14}, channels_last,
                           Path::direct);
      expect_same_as_torch(nn::Conv2dOptions(64, 64, 3).stride(2).padding(1).bias(bias), {3, 64, 7, 7}, channels_last,
                           Path::direct);
      expect_same_as_torch(nn::Conv2dOptions(128, 256, 3).stride(2).padding(1).bias(bias), {2, 128, 4, 4},
                           channels_last, Path::direct);
      expect_same_as_torch(nn::Conv2dOptions(16, 48, 3).padding(1).bias(bias), {2, 16, 7, 7}, channels_last,
                           Path::direct);
      expect_same_as_torch(nn::Conv2dOptions(48, 32, 3).padding(1).bias(bias), {2, 48, 5, 6}, channels_last,
                           Path::direct);
    }
  }
}

TEST(Conv2d, DirectKernelsTakeAnyStridePaddingAndKernelShape) {
  // Strides 1-3, no padding and padding up to the kernel's size - 1, kernels of other shapes, odd sizes, pixels
  // whose kernel falls entirely in the padding (a 1x2 image with padding 2: the bias alone).
  expect_same_as_torch(nn::Conv2dOptions(32, 32, 3).stride(1).padding(0), {3, 32, 5, 6}, true, Path::direct);
  expect_same_as_torch(nn::Conv2dOptions(16, 32, {3, 1}).stride({2, 1}).padding({1, 0}), {3, 16, 6, 3}, false,
                       Path::direct);
  expect_same_as_torch(nn::Conv2dOptions(32, 16, {1, 2}).stride(2), {4, 32, 7, 7}, true, Path::direct);
  expect_same_as_torch(nn::Conv2dOptions(16, 16, {2, 3}).stride({1, 2}).padding({0, 2}), {2, 16, 3, 4}, false,
                       Path::direct);
  expect_same_as_torch(nn::Conv2dOptions(32, 32, 3).stride(2).padding(1), {2, 32, 1, 1}, true, Path::direct);
  expect_same_as_torch(nn::Conv2dOptions(16, 32, 3).padding(2), {2, 16, 1, 2}, true, Path::direct);
  expect_same_as_torch(nn::Conv2dOptions(16, 16, 5).stride(3).padding(2), {2, 16, 7, 4}, false, Path::direct);
  expect_same_as_torch(nn::Conv2dOptions(16, 16, 7).stride(2).padding(3), {2, 16, 13, 11}, true, Path::direct);
  expect_same_as_torch(nn::Conv2dOptions(64, 32, 1).stride(2), {3, 64, 7, 7}, true, Path::direct);
}

TEST(Conv2d, DirectKernelsLeaveWhatTheyDoNotTakeToTorch) {
  // An output map larger than 7x7 (the rule), channel counts that are not multiples of 16, groups, dilation,
  // padding as large as the kernel, float64.
  expect_same_as_torch(nn::Conv2dOptions(32, 32, 3).padding(1), {2, 32, 8, 8}, true, Path::torch);
  expect_same_as_torch(nn::Conv2dOptions(24, 32, 3).padding(1), {2, 24, 6, 6}, true, Path::torch);
  expect_same_as_torch(nn::Conv2dOptions(32, 40, 3).padding(1), {2, 32, 6, 6}, true, Path::torch);
  expect_same_as_torch(nn::Conv2dOptions(32, 32, 3).groups(2).padding(1), {2, 32, 6, 6}, false, Path::torch);
  expect_same_as_torch(nn::Conv2dOptions(32, 32, 3).dilation(2).padding(2), {2, 32, 6, 6}, true, Path::torch);
  expect_same_as_torch(nn::Conv2dOptions(16, 16, 1).padding(1), {2, 16, 3, 3}, true, Path::torch);
  torch::manual_seed(0);
  fl::models::Conv2d conv(nn::Conv2dOptions(32, 32, 3).padding(1));
  conv->to(torch::kFloat64);
  EXPECT_EQ(conv->forward(torch::randn({2, 32, 4, 4}, torch::kFloat64)).grad_fn()->name(), "ConvolutionBackward0");
}

TEST(Conv2d, DirectKernelsGiveTheSameBitsOnOneAndTwoThreads) {
  const int threads_before = at::get_num_threads();
  torch::manual_seed(0);
  fl::models::Conv2d conv(nn::Conv2dOptions(32, 64, 3).stride(2).padding(1));
  fl::models::to_channels_last(*conv);
  const auto x = fl::models::as_channels_last(torch::randn({37, 32, 14, 14}));  // 37 images: slices cut short
  const auto upstream = torch::randn({37, 64, 7, 7}).contiguous(at::MemoryFormat::ChannelsLast);
  std::vector<Grads> results;
  for (const int threads : {1, 2}) {
    at::set_num_threads(threads);
    results.push_back(run(conv, x, upstream));
  }
  at::set_num_threads(threads_before);
  EXPECT_NE(results[0].grad_fn.find("DirectConvFunction"), std::string::npos) << results[0].grad_fn;
  EXPECT_TRUE(torch::equal(results[0].output, results[1].output));
  EXPECT_TRUE(torch::equal(results[0].input, results[1].input));
  EXPECT_TRUE(torch::equal(results[0].weight, results[1].weight));
  EXPECT_TRUE(torch::equal(results[0].bias, results[1].bias));
}

TEST(Conv2d, DirectKernelsKeepTheInputsMemoryFormatAndTheWeightsInTheGradients) {
  torch::manual_seed(0);
  fl::models::Conv2d conv(nn::Conv2dOptions(32, 32, 3).padding(1));
  const auto x = torch::randn({2, 32, 5, 5}).requires_grad_(true);
  const auto y = conv->forward(x);  // a contiguous model on a contiguous batch
  EXPECT_TRUE(y.is_contiguous());
  y.sum().backward();
  EXPECT_TRUE(x.grad().is_contiguous());
  EXPECT_TRUE(conv->weight.grad().is_contiguous());
  fl::models::to_channels_last(*conv);
  conv->zero_grad();
  const auto x_cl = fl::models::as_channels_last(torch::randn({2, 32, 5, 5})).requires_grad_(true);
  const auto y_cl = conv->forward(x_cl);
  EXPECT_TRUE(y_cl.is_contiguous(at::MemoryFormat::ChannelsLast));
  y_cl.sum().backward();
  EXPECT_TRUE(x_cl.grad().is_contiguous(at::MemoryFormat::ChannelsLast));
  EXPECT_TRUE(conv->weight.grad().is_contiguous(at::MemoryFormat::ChannelsLast));
}

TEST(Conv2d, DirectKernelsHandleStridedViewsPartialGradientsAndNoGrad) {
  torch::manual_seed(0);
  fl::models::Conv2d ours(nn::Conv2dOptions(16, 32, 3).stride(2).padding(1));
  nn::Conv2d reference(nn::Conv2dOptions(16, 32, 3).stride(2).padding(1));
  {
    torch::NoGradGuard no_grad;
    reference->weight.copy_(ours->weight);
    reference->bias.copy_(ours->bias);
  }
  // A strided view of a larger batch.
  const auto big = torch::randn({3, 16, 22, 23});
  const auto x = big.slice(2, 0, std::nullopt, 2).slice(3, 1, std::nullopt, 2);
  const auto upstream = torch::randn({3, 32, 6, 6});
  const auto a = run(ours, x, upstream), b = run(reference, x, upstream);
  EXPECT_NE(a.grad_fn.find("DirectConvFunction"), std::string::npos) << a.grad_fn;
  EXPECT_LT(relative_error(a.output, b.output), 1e-6);
  EXPECT_LT(relative_error(a.input, b.input), 1e-6);
  EXPECT_LT(relative_error(a.weight, b.weight), 1e-5);
  // Only the input needs a gradient (a frozen layer).
  ours->zero_grad();
  ours->weight.requires_grad_(false);
  ours->bias.requires_grad_(false);
  auto input = x.clone().requires_grad_(true);
  ours->forward(input).sum().backward();
  auto reference_input = x.clone().requires_grad_(true);
  reference->forward(reference_input).sum().backward();
  EXPECT_LT(relative_error(input.grad(), reference_input.grad()), 1e-6);
  EXPECT_FALSE(ours->weight.grad().defined());
  // Inference mode: the kernels' forward, no graph.
  const c10::InferenceMode inference;
  const auto y = ours->forward(x);
  EXPECT_EQ(y.grad_fn(), nullptr);
  EXPECT_LT(relative_error(y, reference->forward(x)), 1e-6);
}

TEST(Conv2d, DirectKernelsSecondDerivativesAreTorchs) {
  torch::manual_seed(0);
  fl::models::Conv2d ours(nn::Conv2dOptions(16, 16, 3).padding(1));
  nn::Conv2d reference(nn::Conv2dOptions(16, 16, 3).padding(1));
  {
    torch::NoGradGuard no_grad;
    reference->weight.copy_(ours->weight);
    reference->bias.copy_(ours->bias);
  }
  const auto x = torch::randn({2, 16, 6, 6});
  std::vector<at::Tensor> second;
  for (auto* conv : {static_cast<nn::Module*>(ours.get()), static_cast<nn::Module*>(reference.get())}) {
    auto weight = conv->named_parameters()["weight"];
    const auto y = conv == ours.get() ? ours->forward(x) : reference->forward(x);
    const auto grad = torch::autograd::grad({y.pow(2).sum()}, {weight}, {}, true, true)[0];
    weight.mutable_grad() = at::Tensor();
    grad.pow(2).sum().backward();
    second.push_back(weight.grad().clone());
  }
  EXPECT_LT(relative_error(second[0], second[1]), 1e-4);
}

TEST(Conv2d, TheEnvironmentSwitchesTheDirectKernelsOffAndRefusesOtherValues) {
  const auto options = nn::Conv2dOptions(32, 64, 3).stride(2).padding(1);
  setenv("FASTLEARN_DIRECT_CONV", "0", 1);
  expect_same_as_torch(options, {2, 32, 8, 8}, true, Path::torch);
  setenv("FASTLEARN_DIRECT_CONV", "on", 1);
  fl::models::Conv2d conv(options);
  EXPECT_THROW(conv->forward(torch::randn({1, 32, 5, 5})), fl::ConfigError);
  unsetenv("FASTLEARN_DIRECT_CONV");
  expect_same_as_torch(options, {2, 32, 8, 8}, true, Path::direct);
}

TEST(Conv2d, DirectKernelsOfEveryInstructionSetAgree) {
  // The AVX-512, AVX2 and plain variants (where this CPU runs them) on one odd geometry for each block width:
  // 64 channels (4 vectors of 16), 32 and 16 with stride 2, a 3x2 kernel with uneven padding.
  torch::manual_seed(0);
  namespace m = fl::models;
  for (const std::int64_t channels : {64, 32, 16}) {
    const m::DirectConv c{.images = 3,
                          .in_height = 9,
                          .in_width = 8,
                          .in_channels = channels,
                          .out_height = 5,
                          .out_width = 5,
                          .out_channels = channels,
                          .kernel_h = 3,
                          .kernel_w = 2,
                          .stride_h = 2,
                          .stride_w = 2,
                          .pad_h = 1,
                          .pad_w = 1};
    ASSERT_TRUE(m::direct_conv_supports(c));
    const auto input = torch::randn({c.images, c.in_height, c.in_width, channels});  // NHWC
    const auto weight = torch::randn({channels, c.kernel_h, c.kernel_w, channels});  // OHWI
    const auto bias = torch::randn({channels});
    const auto grad = torch::randn({c.images, c.out_height, c.out_width, channels});
    const auto packed = weight.view({channels, -1}).t().contiguous();  // (kh, kw, C, O)
    const auto input_nchw = input.permute({0, 3, 1, 2}), weight_oihw = weight.permute({0, 3, 1, 2});
    const auto grad_nchw = grad.permute({0, 3, 1, 2});
    const auto expected = at::conv2d(input_nchw, weight_oihw, bias, {2, 2}, {1, 1}).permute({0, 2, 3, 1});
    const auto [expected_input, expected_weight, unused] =
        at::convolution_backward(grad_nchw, input_nchw, weight_oihw, std::nullopt, {2, 2}, {1, 1}, {1, 1}, false,
                                 {0, 0}, 1, {true, true, false});
    for (const auto isa : {m::KernelIsa::widest, m::KernelIsa::avx2, m::KernelIsa::baseline}) {
      SCOPED_TRACE(std::to_string(channels) + " " + std::to_string(static_cast<int>(isa)));
      auto out = torch::empty({c.images, c.out_height, c.out_width, channels});
      auto grad_input = torch::empty_like(input);
      auto grad_weight = torch::empty({c.kernel_h, c.kernel_w, channels, channels});  // HWIO
      // In two pieces each, as two threads would split them.
      const auto pixels = c.out_pixels();
      for (const auto& [first, last] : {std::pair{std::int64_t{0}, pixels / 3}, std::pair{pixels / 3, pixels}}) {
        m::direct_conv_forward(c, input.data_ptr<float>(), packed.data_ptr<float>(), bias.data_ptr<float>(),
                               out.data_ptr<float>(), first, last, isa);
      }
      for (std::int64_t phase = 0; phase < 4; ++phase) {
        const auto count = m::direct_conv_phase_pixels(c, phase);
        m::direct_conv_input_grad(c, grad.data_ptr<float>(), weight.data_ptr<float>(), grad_input.data_ptr<float>(),
                                  phase, 0, count / 2, isa);
        m::direct_conv_input_grad(c, grad.data_ptr<float>(), weight.data_ptr<float>(), grad_input.data_ptr<float>(),
                                  phase, count / 2, count, isa);
      }
      m::direct_conv_weight_grad(c, input.data_ptr<float>(), grad.data_ptr<float>(), grad_weight.data_ptr<float>(), 0,
                                 pixels, isa);
      EXPECT_LT(relative_error(out, expected), 1e-6);
      EXPECT_LT(relative_error(grad_input, expected_input.permute({0, 2, 3, 1})), 1e-6);
      EXPECT_LT(relative_error(grad_weight, expected_weight.permute({2, 3, 1, 0})), 1e-5);
      // The forward and the weight gradient read an NCHW input as it is.
      auto nchw = c;
      nchw.input_nchw = true;
      const auto input_cf = input_nchw.contiguous();
      auto out_cf = torch::empty_like(out);
      auto grad_weight_cf = torch::empty_like(grad_weight);
      for (const auto& [first, last] : {std::pair{std::int64_t{0}, pixels / 3}, std::pair{pixels / 3, pixels}}) {
        m::direct_conv_forward(nchw, input_cf.data_ptr<float>(), packed.data_ptr<float>(), bias.data_ptr<float>(),
                               out_cf.data_ptr<float>(), first, last, isa);
      }
      m::direct_conv_weight_grad(nchw, input_cf.data_ptr<float>(), grad.data_ptr<float>(),
                                 grad_weight_cf.data_ptr<float>(), 0, pixels, isa);
      EXPECT_TRUE(torch::equal(out_cf, out)) << "the same sums in the same order";
      EXPECT_TRUE(torch::equal(grad_weight_cf, grad_weight));
    }
  }
}

TEST(Conv2d, DirectRuleTakesOutputMapsOfAtMostSevenBySevenPixels) {
  EXPECT_TRUE(fl::models::uses_direct_conv(49));  // simple_cnn's second layer: 14x14 -> 7x7
  EXPECT_TRUE(fl::models::uses_direct_conv(1));
  EXPECT_FALSE(fl::models::uses_direct_conv(64));  // resnet18's 8x8 stage at 128 px
  EXPECT_TRUE(fl::models::uses_direct_conv(64, {.max_output_pixels = 64}));
}

TEST(Conv2d, DirectKernelsTakeSixteensOfChannelsAndKernelsOfAtMostFortyNineTaps) {
  namespace m = fl::models;
  const auto geometry = [](std::int64_t in, std::int64_t out, std::int64_t kernel, std::int64_t pad) {
    return m::DirectConv{.images = 1,
                         .in_height = 8,
                         .in_width = 8,
                         .in_channels = in,
                         .out_height = 8,
                         .out_width = 8,
                         .out_channels = out,
                         .kernel_h = kernel,
                         .kernel_w = kernel,
                         .pad_h = pad,
                         .pad_w = pad};
  };
  EXPECT_TRUE(m::direct_conv_supports(geometry(32, 64, 3, 1)));
  EXPECT_TRUE(m::direct_conv_supports(geometry(16, 16, 7, 3)));
  EXPECT_FALSE(m::direct_conv_supports(geometry(24, 64, 3, 1)));  // input channels
  EXPECT_FALSE(m::direct_conv_supports(geometry(32, 40, 3, 1)));  // output channels
  EXPECT_FALSE(m::direct_conv_supports(geometry(16, 16, 9, 4)));  // 81 taps
  EXPECT_FALSE(m::direct_conv_supports(geometry(16, 16, 3, 3)));  // padding as large as the kernel
}

}  // namespace
