// models::unet against fastai's create_unet_model: the same parameter counts, fastai's weights giving fastai's outputs
// and ours giving ours in fastai (tests/python/fastai_unet_oracle.py), the output at the input's size, replicas and
// SyncBatchNorm, refusals.
#include <fastlearn/core/error.h>
#include <fastlearn/core/safetensors.h>
#include <fastlearn/distributed/sync_batch_norm.h>
#include <fastlearn/models/fastai_weights.h>
#include <fastlearn/models/torchvision_resnet.h>
#include <fastlearn/models/unet.h>
#include <fastlearn/models/weights.h>
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <torch/torch.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>

#include "support/message_of.h"
#include "support/python_data.h"

namespace fl = fastlearn;
namespace fs = std::filesystem;

namespace {

std::int64_t parameter_count(torch::nn::Module& model) {
  std::int64_t n = 0;
  for (const auto& p : model.parameters()) n += p.numel();
  return n;
}

// The oracle's cases (tests/python/fastai_unet_oracle.py): non-square sizes whose sides are not multiples of 32, a
// 12-pixel-wide one where fastai drops the deepest skip connection, and one with every option set.
const std::map<std::string, fl::models::UnetOptions> kCases{
    {"resnet18", {.arch = "resnet18", .classes = 3, .image_size = {75, 54}}},
    {"resnet34", {.arch = "resnet34", .classes = 3, .image_size = {75, 54}}},
    {"narrow", {.arch = "resnet18", .classes = 3, .image_size = {40, 12}}},
    {"options",
     {.arch = "resnet18",
      .classes = 2,
      .image_size = {45, 70},
      .in_channels = 1,
      .blur = true,
      .blur_final = false,
      .y_range = std::pair{-1.0, 3.0},
      .last_cross = false}},
};

class FastaiUnet : public fastlearn::testing::PythonData<FastaiUnet> {
 protected:
  static void SetUpTestSuite() {
    make("fastai-unet", "'{python}' -W ignore '{source}/tests/python/fastai_unet_oracle.py' '{dir}'");
  }
};

}  // namespace

// One test: the fastai side takes some 20 s to make, and each test of this binary is a process of its own.
TEST_F(FastaiUnet, ParameterCountsAndOutputsAreFastaisBothWays) {
  torch::NoGradGuard no_grad;
  std::map<std::string, std::int64_t> fastai_counts;
  std::ifstream counts(dir_ / "counts.txt");
  for (std::string name; counts >> name;) counts >> fastai_counts[name];
  const auto inputs = fl::load_safetensors(dir_ / "inputs.safetensors");
  const auto fastai_logits = fl::load_safetensors(dir_ / "logits.safetensors");
  std::vector<std::pair<std::string, at::Tensor>> our_logits;
  for (const auto& [name, options] : kCases) {
    SCOPED_TRACE(name);
    // fastai -> fastlearn
    auto model = fl::models::unet(options);
    EXPECT_EQ(parameter_count(*model), fastai_counts.at(name));
    fl::models::load_fastai_unet_weights(*model, dir_ / (name + ".safetensors"));
    model->eval();
    const auto& x = *inputs.find(name);
    const auto out = model->forward(x);
    const auto& expected = *fastai_logits.find(name);
    ASSERT_EQ(out.sizes(), expected.sizes());
    // Within 1e-4 of the output's scale (resnet34's untrained outputs reach 100; float sums differ in order).
    const auto scale = std::max(1.0, expected.abs().max().item<double>());
    EXPECT_LE((out - expected).abs().max().item<double>(), 1e-4 * scale);
    // fastlearn -> fastai: a model of our own (other weights), under fastai's names
    torch::manual_seed(5);
    auto ours = fl::models::unet(options);
    // BatchNorms as if trained (as the fastai side does): shifts of both signs, so that every ReLU matters.
    for (const auto& m : ours->modules()) {
      if (auto* bn = m->as<torch::nn::BatchNorm2dImpl>()) {
        bn->weight.uniform_(0.5, 1.5);
        bn->bias.uniform_(-0.2, 0.2);
        bn->running_mean.uniform_(-0.2, 0.2);
        bn->running_var.uniform_(0.5, 1.5);
      }
    }
    ours->eval();
    fl::save_safetensors(dir_ / fmt::format("fastlearn_{}.safetensors", name),
                         fl::models::fastai_unet_state_dict(*ours));
    our_logits.emplace_back(name, ours->forward(x));
  }
  EXPECT_EQ(fastai_counts.at("resnet18"), 31113108);  // the count fastai's documentation shows for 3 classes
  EXPECT_EQ(fl::models::unet(kCases.at("narrow"))->skips(), (std::vector<int>{5, 4, 2}));  // layer3 -> 4 keeps width 1
  fl::save_safetensors(dir_ / "fastlearn_logits.safetensors", our_logits);
  const auto [code, output] = fastlearn::testing::run_shell(
      fmt::format("'{}' -W ignore '{}/tests/python/fastai_unet_oracle.py' '{}' --check 2>&1", FASTLEARN_PYTHON,
                  FASTLEARN_SOURCE_DIR, dir_.string()));
  EXPECT_EQ(code, 0) << output;
  // A fastai file for another size does not load, and says which tensor.
  auto other = fl::models::unet({.arch = "resnet18", .classes = 3, .image_size = {64, 64}});
  const auto wrong = fastlearn::testing::message_of(
      [&] { fl::models::load_fastai_unet_weights(*other, dir_ / "narrow.safetensors"); });
  EXPECT_NE(wrong.find("narrow.safetensors"), std::string::npos) << wrong;
}

TEST(Unet, OutputHasTheInputsSizeForOddSizesAndAfterBuilding) {
  torch::NoGradGuard no_grad;
  for (const auto& [h, w] : std::vector<std::pair<std::int64_t, std::int64_t>>{{33, 47}, {75, 54}, {17, 9}}) {
    SCOPED_TRACE(fmt::format("{}x{}", h, w));
    auto model = fl::models::unet({.arch = "resnet18", .classes = 4, .image_size = {h, w}});
    model->eval();
    EXPECT_EQ(model->forward(torch::randn({1, 3, h, w})).sizes(), (std::vector<std::int64_t>{1, 4, h, w}));
    // Any size afterwards, as fastai's
    EXPECT_EQ(model->forward(torch::randn({2, 3, 50, 70})).sizes(), (std::vector<std::int64_t>{2, 4, 50, 70}));
  }
  // y_range, other channel counts, no last_cross, blur
  auto ranged = fl::models::unet({.arch = "resnet18",
                                  .classes = 1,
                                  .image_size = {32, 40},
                                  .in_channels = 1,
                                  .blur = true,
                                  .y_range = std::pair{-1.0, 2.0},
                                  .last_cross = false});
  ranged->eval();
  const auto y = ranged->forward(torch::randn({2, 1, 32, 40}) * 10);
  EXPECT_EQ(y.sizes(), (std::vector<std::int64_t>{2, 1, 32, 40}));
  EXPECT_GE(y.min().item<double>(), -1.0);
  EXPECT_LE(y.max().item<double>(), 2.0);
}

TEST(Unet, ReplicasEqualTheOriginalAndItsBatchNormsSync) {
  auto model = fl::models::unet({.arch = "resnet18", .classes = 3, .image_size = {40, 36}});
  const auto x = torch::randn({2, 3, 40, 36});
  auto replica = std::dynamic_pointer_cast<fl::models::UnetImpl>(model->clone());
  ASSERT_TRUE(replica);
  const auto ours = fl::models::model_tensors(*model), theirs = fl::models::model_tensors(*replica);
  ASSERT_EQ(ours.size(), theirs.size());
  for (std::size_t i = 0; i < ours.size(); ++i) {
    EXPECT_EQ(ours[i].first, theirs[i].first);
    EXPECT_TRUE(ours[i].second.equal(theirs[i].second)) << ours[i].first;
    EXPECT_NE(ours[i].second.data_ptr(), theirs[i].second.data_ptr()) << ours[i].first;
  }
  EXPECT_TRUE(model->forward(x).equal(replica->forward(x)));  // training mode: batch statistics, updated alike
  EXPECT_TRUE(model->named_buffers()["4.bn.running_mean"].equal(replica->named_buffers()["4.bn.running_mean"]));
  // Every BatchNorm (the body's, the one after it, each skip's) becomes a SyncBatchNorm under the same names, and
  // without a group gives what BatchNorm gives.
  model->eval();
  const auto before = model->forward(x);
  fl::convert_sync_batchnorm(*model);
  std::int64_t synced = 0;
  for (const auto& m : model->modules()) synced += m->as<fl::SyncBatchNormImpl>() != nullptr;
  EXPECT_EQ(synced, 20 + 1 + 4);
  EXPECT_TRUE(model->forward(x).allclose(before, 1e-5, 1e-5));
  EXPECT_EQ(fl::models::model_tensors(*model).size(), ours.size());
}

TEST(Unet, BodyLoadsTorchvisionWeightsAndBadOptionsAreRefused) {
  const auto dir = fs::temp_directory_path() / fmt::format("fastlearn-unet-{}", ::getpid());
  fs::create_directories(dir);
  torch::manual_seed(3);
  auto resnet = fl::models::resnet18();
  fl::save_safetensors(dir / "resnet18.safetensors", fl::models::model_tensors(*resnet));
  auto model = fl::models::unet(
      {.arch = "resnet18", .classes = 2, .image_size = {64, 64}, .weights = dir / "resnet18.safetensors"});
  EXPECT_TRUE(
      model->named_parameters()["0.layer3.1.conv2.weight"].equal(resnet->named_parameters()["layer3.1.conv2.weight"]));
  auto grey = fl::models::unet({.arch = "resnet18",
                                .classes = 2,
                                .image_size = {64, 64},
                                .weights = dir / "resnet18.safetensors",
                                .in_channels = 1});
  EXPECT_TRUE(
      grey->named_parameters()["0.conv1.weight"].allclose(resnet->named_parameters()["conv1.weight"].sum(1, true)));
  fs::remove_all(dir);
  EXPECT_THROW(fl::models::unet({.arch = "resnet101", .image_size = {64, 64}}), fl::ConfigError);
  const auto unset = fastlearn::testing::message_of([] { fl::models::unet({.arch = "resnet18"}); });
  EXPECT_NE(unset.find("image_size"), std::string::npos) << unset;
  EXPECT_THROW(fl::models::unet({.classes = 0, .image_size = {64, 64}}), fl::ConfigError);
  EXPECT_THROW(fl::models::unet({.image_size = {64, 64}, .y_range = std::pair{1.0, 1.0}}), fl::ConfigError);
  EXPECT_EQ(fl::models::fastai_unet_name("0.layer1.0.conv1.weight"), "layers.0.4.0.conv1.weight");
  EXPECT_EQ(fl::models::fastlearn_unet_name("layers.4.shuf.0.0.weight"), "4.shuf.0.0.weight");
  EXPECT_THROW(fl::models::fastlearn_unet_name("4.shuf.0.0.weight"), fl::ConfigError);
}

TEST(Unet, StartsAsFastaiInitialisesIt) {
  torch::NoGradGuard no_grad;
  auto model = fl::models::unet({.arch = "resnet18", .classes = 3, .image_size = {64, 64}});
  const auto params = model->named_parameters();
  // fastai's BatchNorm: scale 1, shift 1e-3 (the one after the body, each skip's)
  for (const auto* name : {"1.bias", "4.bn.bias", "7.bn.bias"}) {
    EXPECT_TRUE(params[name].eq(1e-3F).all().item<bool>()) << name;
  }
  EXPECT_TRUE(params["1.weight"].eq(1).all().item<bool>());
  // apply_init (Kaiming normal, bias 0) on the middle, the blocks' convolutions and the residual block; the shuffles'
  // biases 0 (bias_std 0); the head's bias drawn with std 0.01
  for (const auto* name : {"3.0.0.bias", "3.1.0.bias", "4.conv1.0.bias", "6.conv2.0.bias", "11.convpath.1.0.bias",
                           "4.shuf.0.0.bias", "8.0.0.bias"}) {
    EXPECT_TRUE(params[name].eq(0).all().item<bool>()) << name;
  }
  EXPECT_GT(params["12.0.bias"].abs().max().item<double>(), 0);
  EXPECT_LT(params["12.0.bias"].abs().max().item<double>(), 0.1);
  // Kaiming normal, fan in: std sqrt(2 / fan_in)
  const auto& middle = params["3.0.0.weight"];
  const double fan_in = static_cast<double>(middle.size(1) * middle.size(2) * middle.size(3));
  EXPECT_NEAR(middle.std().item<double>(), std::sqrt(2.0 / fan_in), 0.05 * std::sqrt(2.0 / fan_in));
  // ICNR: the upsampled map starts as a nearest-neighbour upsampling, each 2x2 block of outputs one value
  auto shuffle = model->named_children()["4"]->named_children()["shuf"]->as<torch::nn::SequentialImpl>();
  const auto up = shuffle->forward(torch::randn({1, 512, 3, 5}));
  const auto corners = up.slice(2, 0, 6, 2).slice(3, 0, 10, 2);
  for (const auto& [dy, dx] : std::vector<std::pair<int, int>>{{0, 1}, {1, 0}, {1, 1}}) {
    EXPECT_TRUE(up.slice(2, dy, 6, 2).slice(3, dx, 10, 2).equal(corners));
  }
}
