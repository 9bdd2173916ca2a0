// models::AvgPool2d: the mean over a view equals ATen's average pooling in values and gradients, and the view
// is taken only where it was measured to be faster (large channels-last CUDA tensors with even sides).
#include <fastlearn/core/error.h>
#include <fastlearn/models/avg_pool2d.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

namespace fl = fastlearn;
namespace F = torch::nn::functional;

namespace {

at::Tensor channels_last_randn(at::IntArrayRef shape, at::ScalarType dtype, std::uint64_t seed) {
  auto gen = at::detail::createCPUGenerator(seed);
  return at::randn(shape, gen).to(dtype).contiguous(at::MemoryFormat::ChannelsLast).requires_grad_(true);
}

}  // namespace

TEST(AvgPool2d, TheMeanOverAViewEqualsAvgPoolInValuesAndGradients) {
  for (const auto dtype : {at::kFloat, at::kBFloat16}) {
    for (const auto& shape : {std::vector<std::int64_t>{2, 3, 8, 6}, std::vector<std::int64_t>{4, 16, 10, 12}}) {
      const auto a = channels_last_randn(shape, dtype, 7), b = a.detach().clone().requires_grad_(true);
      const auto by_view = fl::models::avg_pool_2x2_by_view(a);
      const auto by_pool = F::avg_pool2d(b, F::AvgPool2dFuncOptions(2).ceil_mode(true));
      const double tol = dtype == at::kBFloat16 ? 1e-2 : 1e-6;
      ASSERT_EQ(by_view.sizes(), by_pool.sizes());
      EXPECT_TRUE(by_view.is_contiguous(at::MemoryFormat::ChannelsLast)) << "the layout carries through";
      EXPECT_TRUE(torch::allclose(by_view.to(at::kFloat), by_pool.to(at::kFloat), tol, tol)) << c10::toString(dtype);
      const auto grad = at::randn(by_pool.sizes()).to(dtype);
      by_view.backward(grad);
      by_pool.backward(grad);
      EXPECT_TRUE(torch::allclose(a.grad().to(at::kFloat), b.grad().to(at::kFloat), tol, tol)) << c10::toString(dtype);
    }
  }
}

TEST(AvgPool2d, OnTheCpuThePoolingKernelIsKept) {
  // It was 4-7x faster there than the mean over a view. The CUDA side of the rule is in gpu_test.
  const auto big = at::zeros({1, 8, 4096, 512}).contiguous(at::MemoryFormat::ChannelsLast);  // 16.8M elements
  EXPECT_FALSE(fl::models::pools_by_view(big, torch::nn::AvgPool2dOptions(2).ceil_mode(true)));
}

TEST(AvgPool2d, TheModuleIsTorchsAvgPoolOnOtherInputsAndClonesAsItself) {
  // Odd sides with ceil_mode, as the xresnet's shortcut pools a 7x7 map: torch's path, torch's result.
  fl::models::AvgPool2d pool(torch::nn::AvgPool2dOptions(2).ceil_mode(true));
  torch::nn::AvgPool2d reference(torch::nn::AvgPool2dOptions(2).ceil_mode(true));
  const auto x = channels_last_randn({2, 4, 7, 9}, at::kFloat, 3);
  EXPECT_TRUE(torch::equal(pool->forward(x), reference->forward(x)));
  const auto copy = std::dynamic_pointer_cast<fl::models::AvgPool2dImpl>(pool->clone());
  ASSERT_NE(copy, nullptr) << "clone stays a models::AvgPool2d";
  EXPECT_TRUE(copy->options.ceil_mode());
}

TEST(AvgPool2d, TheEnvironmentSwitchIsReadAtEachForwardAndRefusesOtherValues) {
  fl::models::AvgPool2d pool(torch::nn::AvgPool2dOptions(2).ceil_mode(true));
  const auto x = channels_last_randn({2, 4, 8, 8}, at::kFloat, 4);
  EXPECT_TRUE(fl::models::pool_by_view_enabled());
  setenv("FASTLEARN_POOL_BY_VIEW", "0", 1);
  EXPECT_FALSE(fl::models::pool_by_view_enabled());
  EXPECT_EQ(pool->forward(x).grad_fn()->name(), "AvgPool2DBackward0");
  setenv("FASTLEARN_POOL_BY_VIEW", "no", 1);
  try {
    pool->forward(x);
    ADD_FAILURE() << "FASTLEARN_POOL_BY_VIEW=no was accepted";
  } catch (const fl::ConfigError& e) {
    EXPECT_STREQ(e.what(), "FASTLEARN_POOL_BY_VIEW is 'no': it must be 0 (ATen's pooling kernel everywhere) or 1");
  }
  setenv("FASTLEARN_POOL_BY_VIEW", "1", 1);
  EXPECT_TRUE(fl::models::pool_by_view_enabled());
  unsetenv("FASTLEARN_POOL_BY_VIEW");
}
