// models::Flatten: torch's Flatten in values and gradients, with the gradient of a channels-last input handed
// back channels-last (torch's is NCHW), and the built-in models use it.
#include <fastlearn/core/error.h>
#include <fastlearn/models/flatten.h>
#include <fastlearn/models/memory_format.h>
#include <fastlearn/models/models.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

namespace fl = fastlearn;

namespace {

constexpr auto kChannelsLast = at::MemoryFormat::ChannelsLast;

at::Tensor channels_last_randn(at::IntArrayRef shape, std::uint64_t seed) {
  auto gen = at::detail::createCPUGenerator(seed);
  return at::randn(shape, gen).contiguous(kChannelsLast).requires_grad_(true);
}

// The gradient that reaches `x`, as the layer before the flatten receives it (a leaf's .grad() would not do: it
// is copied into the leaf's own layout).
struct SeenGradient {
  at::Tensor grad;
  at::Tensor watch(const at::Tensor& leaf) {
    auto x = leaf * 1;  // a non-leaf with the leaf's layout
    x.register_hook([this](const at::Tensor& g) { grad = g; });
    return x;
  }
};

}  // namespace

TEST(Flatten, AChannelsLastInputGetsTorchsValuesAndGradientInItsOwnLayout) {
  for (const auto& [start, end] : {std::pair<std::int64_t, std::int64_t>{1, -1}, {0, -1}, {1, 2}}) {
    fl::models::Flatten ours(torch::nn::FlattenOptions().start_dim(start).end_dim(end));
    torch::nn::Flatten torchs(torch::nn::FlattenOptions().start_dim(start).end_dim(end));
    const auto a = channels_last_randn({3, 5, 4, 2}, 1), b = a.detach().clone().requires_grad_(true);
    SeenGradient ours_seen, torchs_seen;
    const auto y = ours->forward(ours_seen.watch(a)), expected = torchs->forward(torchs_seen.watch(b));
    ASSERT_TRUE(torch::equal(y, expected)) << start << ".." << end;
    const auto grad = at::randn(y.sizes());
    y.backward(grad);
    expected.backward(grad);
    EXPECT_TRUE(torch::equal(a.grad(), b.grad())) << start << ".." << end;
    EXPECT_TRUE(ours_seen.grad.is_contiguous(kChannelsLast)) << start << ".." << end;
    EXPECT_FALSE(torchs_seen.grad.is_contiguous(kChannelsLast)) << "torch's is NCHW, the reason for models::Flatten";
  }
}

TEST(Flatten, OtherInputsTakeTorchsFlattenAndItClonesAsItself) {
  fl::models::Flatten flatten;
  const auto contiguous = at::randn({2, 3, 4, 4}).requires_grad_(true);
  const auto y = flatten->forward(contiguous);
  EXPECT_EQ(y.data_ptr(), contiguous.data_ptr()) << "a contiguous input flattens to a view";
  const auto no_grad = at::randn({2, 3, 4, 4}).contiguous(kChannelsLast);
  EXPECT_TRUE(torch::equal(flatten->forward(no_grad), no_grad.flatten(1)));
  const auto name = flatten->forward(no_grad.requires_grad_(true)).grad_fn()->name();
  EXPECT_NE(name.find("FlattenKeepingLayout"), std::string::npos) << name;
  fl::models::Flatten from_two(torch::nn::FlattenOptions().start_dim(2));
  const auto copy = std::dynamic_pointer_cast<fl::models::FlattenImpl>(from_two->clone());
  ASSERT_NE(copy, nullptr) << "clone stays a models::Flatten";
  EXPECT_EQ(copy->options.start_dim(), 2);
}

TEST(Flatten, TheEnvironmentSwitchIsReadAtEachForwardAndRefusesOtherValues) {
  fl::models::Flatten flatten;
  const auto x = channels_last_randn({2, 4, 3, 3}, 2);
  EXPECT_TRUE(fl::models::flatten_keeps_layout_enabled());
  setenv("FASTLEARN_FLATTEN_KEEPS_LAYOUT", "0", 1);
  EXPECT_FALSE(fl::models::flatten_keeps_layout_enabled());
  SeenGradient seen;
  flatten->forward(seen.watch(x)).sum().backward();
  EXPECT_FALSE(seen.grad.is_contiguous(kChannelsLast)) << "switched off: torch's flatten";
  setenv("FASTLEARN_FLATTEN_KEEPS_LAYOUT", "yes", 1);
  try {
    flatten->forward(at::randn({2, 3}));
    ADD_FAILURE() << "FASTLEARN_FLATTEN_KEEPS_LAYOUT=yes was accepted";
  } catch (const fl::ConfigError& e) {
    EXPECT_STREQ(
        e.what(),
        "FASTLEARN_FLATTEN_KEEPS_LAYOUT is 'yes': it must be 0 (torch's flatten, whose gradient is NCHW) or 1");
  }
  unsetenv("FASTLEARN_FLATTEN_KEEPS_LAYOUT");
}

TEST(Flatten, TheConvolutionalModelsFlattenWithIt) {
  for (auto model : {fl::models::simple_cnn(10, 1), fl::models::conv_net({})}) {
    int found = 0;
    for (const auto& module : model->children())
      found += std::dynamic_pointer_cast<fl::models::FlattenImpl>(module) != nullptr;
    EXPECT_EQ(found, 1);
    fl::models::to_channels_last(*model);
    const auto x = fl::models::as_channels_last(at::randn({4, 1, 28, 28}));
    model->forward(x).sum().backward();  // the gradients reach the first convolution through the flatten
    const auto first = model->parameters().front();
    ASSERT_TRUE(first.grad().defined());
    EXPECT_GT(first.grad().abs().sum().item<double>(), 0);
  }
}
