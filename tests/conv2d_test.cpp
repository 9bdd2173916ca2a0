// models::Conv2d against torch::nn::Conv2d with the same parameters: the same output and the same input,
// weight and bias gradients (to float32 rounding) where it computes the weight gradient by patches, in both
// memory formats, with and without bias, for strides, paddings and kernels of both shapes, in chunks of the
// batch; torch's own path where the rule or the tensors do not fit; clones that stay models::Conv2d.
#include <ATen/autocast_mode.h>
#include <fastlearn/core/error.h>
#include <fastlearn/models/conv2d.h>
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

// A models::Conv2d and a torch::nn::Conv2d with the same options and weights, run on the same batch.
void expect_same_as_torch(const nn::Conv2dOptions& options, std::vector<std::int64_t> input_shape, bool channels_last,
                          bool expect_patches) {
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
    fl::to_channels_last(*ours);
    fl::to_channels_last(*reference);
  }
  auto upstream = torch::randn_like(reference->forward(x).detach());
  const auto a = run(ours, x, upstream), b = run(reference, x, upstream);
  EXPECT_EQ(a.grad_fn.find("ConvWithPatchWeightGrad") != std::string::npos, expect_patches) << a.grad_fn;
  EXPECT_LT(relative_error(a.output, b.output), 1e-6);
  EXPECT_LT(relative_error(a.input, b.input), 1e-6);
  EXPECT_LT(relative_error(a.weight, b.weight), 1e-5);
  EXPECT_EQ(a.weight.sizes(), b.weight.sizes());
  if (b.bias.defined()) {
    EXPECT_LT(relative_error(a.bias, b.bias), 1e-5);
  }
}

TEST(Conv2d, SmallFeatureMapsWithManyChannelsGetTheSameGradientsAsTorch) {
  // conv_net's last layer (128 -> 256, 4x4 -> 2x2; fewer output channels here) in both formats, with and
  // without bias.
  for (const bool channels_last : {false, true}) {
    for (const bool bias : {false, true}) {
      SCOPED_TRACE(std::to_string(channels_last) + std::to_string(bias));
      expect_same_as_torch(nn::Conv2dOptions(128, 128, 3).stride(2).padding(1).bias(bias), {6, 128, 4, 4},
                           channels_last, true);
    }
  }
}

TEST(Conv2d, StridesPaddingsAndKernelsOfEitherShapeMatchTorch) {
  expect_same_as_torch(nn::Conv2dOptions(64, 128, 3).stride(1).padding(0), {5, 64, 5, 6}, true, true);
  expect_same_as_torch(nn::Conv2dOptions(64, 128, {3, 1}).stride({2, 1}).padding({1, 0}), {3, 64, 6, 3}, false, true);
  expect_same_as_torch(nn::Conv2dOptions(64, 128, {1, 2}).stride(2), {4, 64, 7, 7}, true, true);
  expect_same_as_torch(nn::Conv2dOptions(96, 128, {2, 3}).stride({1, 2}).padding({0, 2}), {2, 96, 3, 4}, false, true);
  // Kernel offsets that fall entirely in the padding for some or all output pixels.
  expect_same_as_torch(nn::Conv2dOptions(64, 128, 3).stride(2).padding(1), {2, 64, 1, 1}, true, true);
  expect_same_as_torch(nn::Conv2dOptions(64, 128, 3).padding(3), {2, 64, 2, 3}, true, true);
  expect_same_as_torch(nn::Conv2dOptions(64, 128, 5).stride(3).padding(2), {2, 64, 7, 4}, false, true);
}

TEST(Conv2d, OtherShapesAndTensorsTakeTorchsPath) {
  // Too few input channels for the rule; too few output channels; a pointwise kernel; groups; dilation; float64.
  expect_same_as_torch(nn::Conv2dOptions(32, 128, 3).stride(2).padding(1), {4, 32, 8, 8}, false, false);
  expect_same_as_torch(nn::Conv2dOptions(64, 64, 3).padding(1), {2, 64, 5, 5}, true, false);
  expect_same_as_torch(nn::Conv2dOptions(128, 128, 1), {2, 128, 4, 4}, true, false);
  expect_same_as_torch(nn::Conv2dOptions(128, 128, 3).groups(2).padding(1), {2, 128, 4, 4}, false, false);
  expect_same_as_torch(nn::Conv2dOptions(128, 128, 3).dilation(2).padding(2), {2, 128, 4, 4}, false, false);
  torch::manual_seed(0);
  fl::models::Conv2d conv(nn::Conv2dOptions(128, 128, 3).padding(1));
  conv->to(torch::kFloat64);
  auto y = conv->forward(torch::randn({2, 128, 4, 4}, torch::kFloat64));
  EXPECT_EQ(y.grad_fn()->name(), "ConvolutionBackward0");
  {
    torch::NoGradGuard no_grad;
    EXPECT_EQ(conv->forward(torch::randn({2, 128, 4, 4}, torch::kFloat64)).grad_fn(), nullptr);
  }
}

TEST(Conv2d, TheEnvironmentSwitchesThePatchProductOffAndRefusesOtherValues) {
  const auto options = nn::Conv2dOptions(128, 128, 3).padding(1);
  expect_same_as_torch(options, {2, 128, 4, 4}, true, true);
  setenv("FASTLEARN_CONV_PATCH_GRAD", "0", 1);
  expect_same_as_torch(options, {2, 128, 4, 4}, true, false);
  setenv("FASTLEARN_CONV_PATCH_GRAD", "off", 1);
  fl::models::Conv2d conv(options);
  EXPECT_THROW(conv->forward(torch::randn({1, 128, 3, 3})), fl::ConfigError);
  setenv("FASTLEARN_CONV_PATCH_GRAD", "1", 1);
  expect_same_as_torch(options, {2, 128, 4, 4}, true, true);
  unsetenv("FASTLEARN_CONV_PATCH_GRAD");
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

TEST(Conv2d, RuleTakesManyChannelsAndKernelsLargerThanOnePixel) {
  EXPECT_TRUE(fl::models::uses_patch_weight_grad(128, 256, 3, 3));  // conv_net's last layer
  EXPECT_TRUE(fl::models::uses_patch_weight_grad(64, 128, 3, 3));
  EXPECT_TRUE(fl::models::uses_patch_weight_grad(512, 512, 1, 2));
  EXPECT_FALSE(fl::models::uses_patch_weight_grad(32, 128, 3, 3));   // too few input channels
  EXPECT_FALSE(fl::models::uses_patch_weight_grad(64, 64, 3, 3));    // too few output channels
  EXPECT_FALSE(fl::models::uses_patch_weight_grad(256, 256, 1, 1));  // pointwise
  EXPECT_TRUE(fl::models::uses_patch_weight_grad(64, 64, 3, 3, {.min_out_channels = 64}));
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

}  // namespace
