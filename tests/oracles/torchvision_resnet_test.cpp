// models::resnet18/34/50 against torchvision's: the same state-dict keys and shapes (so exported weights
// load strictly), the same logits on the same PNG files, errors that name the tensor when weights do not
// fit, and BatchNorms that convert to SyncBatchNorm. The torchvision side is tests/python/torchvision_resnet_oracle.py.
#include <fastlearn/core/error.h>
#include <fastlearn/core/safetensors.h>
#include <fastlearn/data/image_decode.h>
#include <fastlearn/distributed/sync_batch_norm.h>
#include <fastlearn/learner/vision_learner.h>
#include <fastlearn/models/fastai_weights.h>
#include <fastlearn/models/tabular_model.h>
#include <fastlearn/models/torchvision_resnet.h>
#include <fastlearn/models/vision_model.h>
#include <fastlearn/models/weights.h>
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <torch/torch.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <map>

#include "support/message_of.h"
#include "support/python_data.h"

namespace fl = fastlearn;
namespace fs = std::filesystem;

namespace {

class TorchvisionOracle : public fastlearn::testing::PythonData<TorchvisionOracle> {
 protected:
  static void SetUpTestSuite() {
    make("torchvision", "'{python}' '{source}/tests/python/torchvision_resnet_oracle.py' '{dir}'");
  }
  // The two PNG files as the model's input: [0, 1], ImageNet's mean and std.
  static at::Tensor images() {
    std::vector<at::Tensor> xs;
    for (int i = 0; i < 2; ++i) xs.push_back(fl::read_image(dir_ / fmt::format("image{}.png", i)));
    auto x = torch::stack(xs).to(torch::kFloat32).div(255);
    return (x - torch::tensor({0.485, 0.456, 0.406}).view({1, 3, 1, 1})) /
           torch::tensor({0.229, 0.224, 0.225}).view({1, 3, 1, 1});
  }
};

class Arch : public TorchvisionOracle, public ::testing::WithParamInterface<std::string> {};

}  // namespace

TEST(TorchvisionResNet, ParameterCountsAreTorchvisions) {
  auto count = [](fl::models::TorchvisionResNet m) {
    std::int64_t n = 0;
    for (const auto& p : m->parameters()) n += p.numel();
    return n;
  };
  EXPECT_EQ(count(fl::models::resnet18()), 11689512);
  EXPECT_EQ(count(fl::models::resnet34()), 21797672);
  EXPECT_EQ(count(fl::models::resnet50()), 25557032);
  EXPECT_THROW(fl::models::torchvision_resnet("resnet101"), fl::ConfigError);
}

TEST(TorchvisionResNet, BatchNormsConvertToSyncBatchNormAndTheModelStillRuns) {
  auto model = fl::models::resnet18(10);
  model->eval();
  torch::NoGradGuard no_grad;
  const auto x = torch::randn({2, 3, 64, 64});
  const auto before = model->forward(x);
  fl::convert_sync_batchnorm(*model);
  std::int64_t sync = 0;
  for (const auto& m : model->modules()) sync += m->as<fl::SyncBatchNormImpl>() != nullptr;
  EXPECT_EQ(sync, 20) << "bn1, 2 per basic block and 3 downsample BatchNorms";
  EXPECT_TRUE(model->forward(x).allclose(before, 1e-5, 1e-5)) << "one process: SyncBatchNorm acts as BatchNorm";
}

TEST_P(Arch, StateDictLoadsStrictlyAndTheLogitsAreTorchvisions) {
  const auto arch = GetParam();
  auto model = fl::models::torchvision_resnet(arch);
  fl::models::load_weights(*model, dir_ / (arch + ".safetensors"));  // strict: every key and shape
  model->eval();
  torch::NoGradGuard no_grad;
  const auto logits = model->forward(images());
  const auto expected = *fl::load_safetensors(dir_ / (arch + "_logits.safetensors")).find("logits");
  ASSERT_EQ(logits.sizes(), expected.sizes());
  // Relative to the logits' norm: the deeper models' logits run into the tens, and the two sides may pick
  // different convolution algorithms, whose float32 rounding differs in the last bits.
  const double relative = ((logits - expected).norm() / expected.norm()).item<double>();
  EXPECT_LT(relative, 1e-4) << arch << ": largest difference " << (logits - expected).abs().max().item<double>()
                            << " of logits up to " << expected.abs().max().item<double>();
  EXPECT_GT(expected.std().item<double>(), 0.1) << "the logits must differ from each other for the check to mean much";
}

INSTANTIATE_TEST_SUITE_P(Torchvision, Arch, ::testing::Values("resnet18", "resnet34", "resnet50"));

TEST_F(TorchvisionOracle, WeightsThatDoNotFitNameTheTensorAndChangeNothing) {
  auto content = fl::load_safetensors(dir_ / "resnet18.safetensors");
  auto ten_classes = fl::models::resnet18(10);
  const auto before = ten_classes->named_parameters()["conv1.weight"].clone();
  auto error =
      fastlearn::testing::message_of([&] { fl::models::load_weights(*ten_classes, dir_ / "resnet18.safetensors"); });
  EXPECT_NE(error.find("tensor 'fc.weight' has shape [1000, 512] in the file but [10, 512] in the model"),
            std::string::npos)
      << error;
  EXPECT_TRUE(torch::equal(ten_classes->named_parameters()["conv1.weight"], before)) << "nothing was copied";

  std::erase_if(content.tensors, [](const auto& named) { return named.first == "layer2.1.bn2.running_var"; });
  auto model = fl::models::resnet18();
  error = fastlearn::testing::message_of(
      [&] { fl::models::copy_weights(fl::models::match_weights(*model, content.tensors, "cut.safetensors")); });
  EXPECT_NE(error.find("cut.safetensors: no tensor 'layer2.1.bn2.running_var'"), std::string::npos) << error;
  // Without strict, a file without the head loads into a model with another head; the head stays its own.
  std::erase_if(content.tensors, [](const auto& named) { return named.first.starts_with("fc."); });
  const auto head = ten_classes->named_parameters()["fc.weight"].clone();
  fl::models::copy_weights(
      fl::models::match_weights(*ten_classes, content.tensors, "body.safetensors", {.strict = false}));
  EXPECT_FALSE(torch::equal(ten_classes->named_parameters()["conv1.weight"], before));
  EXPECT_TRUE(torch::equal(ten_classes->named_parameters()["fc.weight"], head));
}

// vision_learner: the body from the exported torchvision weights, frozen but for its BatchNorms, a new head for
// the data's 3 classes trained; fine_tune then trains everything.
TEST_F(TorchvisionOracle, VisionLearnerLoadsTheBodyFreezesItAndFineTunes) {
  const auto x = torch::rand({24, 3, 32, 32});
  const auto y = torch::arange(24, torch::kLong) % 3;
  auto ds = std::make_shared<fl::TensorDataset>(std::vector<at::Tensor>{x}, std::vector<at::Tensor>{y});
  fl::DataLoaders dls(fl::DataLoader(ds, {.bs = 8, .shuffle = true, .seed = 0}), fl::DataLoader(ds, {.bs = 8}),
                      std::vector<std::string>{"a", "b", "c"});
  auto learn = fl::vision_learner(dls, {.weights = dir_ / "resnet18.safetensors"}, {.progress = false});
  const auto file = fl::load_safetensors(dir_ / "resnet18.safetensors");
  const auto tensors = fl::models::model_tensors(learn->model());
  const auto find = [&](const std::string& name) {
    for (const auto& [n, t] : tensors)
      if (n == name) return t;
    throw std::runtime_error("no tensor " + name);
  };
  EXPECT_TRUE(torch::equal(find("0.conv1.weight"), *file.find("conv1.weight")));
  EXPECT_FALSE(find("0.conv1.weight").requires_grad()) << "the pretrained body starts frozen";
  EXPECT_TRUE(find("0.bn1.weight").requires_grad()) << "but its BatchNorms train (train_bn)";
  EXPECT_TRUE(find("1.3.weight").requires_grad()) << "and the new head trains";
  EXPECT_EQ(find("1.7.weight").size(0), 3) << "the head ends in the data's classes";
  // Channels-last by default: the same logits as the default layout (the same weights and head draw).
  EXPECT_TRUE(find("0.conv1.weight").is_contiguous(at::MemoryFormat::ChannelsLast));
  {
    torch::manual_seed(3);
    auto fast = fl::vision_learner(dls, {.weights = dir_ / "resnet18.safetensors"}, {.progress = false});
    torch::manual_seed(3);
    auto plain = fl::vision_learner(dls, {.weights = dir_ / "resnet18.safetensors", .channels_last = false},
                                    {.progress = false});
    EXPECT_TRUE(fl::models::model_tensors(plain->model()).front().second.is_contiguous());
    fast->model().eval();
    plain->model().eval();
    torch::NoGradGuard no_grad;
    const auto a = fast->forward({x.narrow(0, 0, 8)}), b = plain->forward({x.narrow(0, 0, 8)});
    EXPECT_TRUE(a.allclose(b, 1e-4, 1e-4)) << (a - b).abs().max();
  }
  learn->fine_tune(1);
  EXPECT_TRUE(find("0.conv1.weight").requires_grad()) << "fine_tune unfreezes";
  EXPECT_FALSE(torch::equal(find("0.conv1.weight"), *file.find("conv1.weight"))) << "and trains the body";
}

// Grey images and pretrained RGB weights: the first convolution adapted as fastai's vision_learner adapts it.
TEST_F(TorchvisionOracle, OtherChannelCountsAdaptTheFirstConvolutionAsFastaiDoes) {
  const auto weights = dir_ / "resnet18.safetensors";
  const auto rgb = *fl::load_safetensors(weights).find("conv1.weight");
  const auto conv1 = [](const torch::nn::Sequential& model) { return model->named_parameters()["0.conv1.weight"]; };
  std::map<std::int64_t, torch::nn::Sequential> models;
  for (const std::int64_t channels : {1, 2, 3, 4}) {
    torch::manual_seed(0);  // the same head for each
    models[channels] = fl::models::vision_model({.classes = 3, .weights = weights, .in_channels = channels});
    models[channels]->eval();
    EXPECT_EQ(conv1(models[channels]).size(1), channels);
  }
  EXPECT_TRUE(torch::equal(conv1(models[1]), rgb.sum(1, true)));
  EXPECT_TRUE(torch::equal(conv1(models[2]), rgb.narrow(1, 0, 2) * 1.5));
  EXPECT_TRUE(torch::equal(conv1(models[3]), rgb));
  EXPECT_TRUE(torch::equal(conv1(models[4]).narrow(1, 0, 3), rgb));
  EXPECT_EQ(conv1(models[4]).narrow(1, 3, 1).abs().sum().item<float>(), 0.0f);
  // A grey image gives the features the RGB body gives for that grey in R, G and B (the heads differ: their
  // initial draws come after conv1's, which have another size).
  torch::NoGradGuard no_grad;
  const auto grey = torch::rand({2, 1, 64, 64});
  const auto body = [&](std::int64_t channels) { return models[channels][0]->as<fl::models::TorchvisionResNetImpl>(); };
  const auto a = body(1)->forward(grey), b = body(3)->forward(grey.expand({2, 3, 64, 64}).contiguous());
  EXPECT_LT((a - b).abs().max().item<double>(), 1e-4 * (1 + b.abs().max().item<double>()));
  EXPECT_THROW(fl::models::first_layer_weights(rgb, 0), fl::ConfigError);
  EXPECT_THROW(fl::models::first_layer_weights(rgb.narrow(1, 0, 2), 1), fl::ConfigError);
}

// vision_learner reads the channel count from the data (user trial 4: grey images met a raw torch error).
TEST_F(TorchvisionOracle, VisionLearnerOnGreyImagesTakesOneChannelFromTheData) {
  const auto x = torch::rand({16, 1, 32, 32});
  const auto y = torch::arange(16, torch::kLong) % 2;
  auto ds = std::make_shared<fl::TensorDataset>(std::vector<at::Tensor>{x}, std::vector<at::Tensor>{y});
  fl::DataLoaders dls(fl::DataLoader(ds, {.bs = 8, .shuffle = true, .seed = 0}), fl::DataLoader(ds, {.bs = 8}),
                      std::vector<std::string>{"a", "b"});
  EXPECT_EQ(fl::image_channels(dls), 1);
  auto learn = fl::vision_learner(dls, {.weights = dir_ / "resnet18.safetensors"}, {.progress = false});
  EXPECT_EQ(learn->model().named_parameters()["0.conv1.weight"].size(1), 1);
  learn->fit(1);
  EXPECT_TRUE(std::isfinite(learn->recorder().history().back().train_loss));
}

// --- fastai's vision_learner and tabular models: the same logits with the same weights, both ways ----------------
// The fastai side is tests/python/fastai_models_oracle.py.

namespace {

class FastaiModels : public fastlearn::testing::PythonData<FastaiModels> {
 protected:
  static void SetUpTestSuite() {
    make("fastai-models", "'{python}' -W ignore '{source}/tests/python/fastai_models_oracle.py' '{dir}'");
  }
  static fl::models::TabularModel tabular() {
    return fl::models::TabularModel(
        std::vector<std::pair<std::int64_t, std::int64_t>>{{4, 3}, {5, 2}}, 2, 3,
        fl::models::TabularModelOptions{.layers = {8, 4}, .ps = {0.1, 0.1}, .embed_p = 0.1});
  }
  static at::Tensor input(const std::string& name) {
    return *fl::load_safetensors(dir_ / "inputs.safetensors").find(name);
  }
};

}  // namespace

TEST_F(FastaiModels, FastaisWeightsGiveFastaisLogitsAndOursGiveOursInFastai) {
  torch::NoGradGuard no_grad;
  const auto fastai_logits = fl::load_safetensors(dir_ / "logits.safetensors");
  // fastai -> fastlearn
  auto vision = fl::models::vision_model({.arch = "resnet18", .classes = 3});
  fl::models::load_fastai_vision_weights(*vision, dir_ / "vision.safetensors");
  vision->eval();
  EXPECT_TRUE(vision->forward(input("image")).allclose(*fastai_logits.find("vision"), 1e-4, 1e-4));
  auto table = tabular();
  fl::models::load_weights(*table, dir_ / "tabular.safetensors");  // the same names: loaded as they are
  table->eval();
  EXPECT_TRUE(table->forward(input("x_cat"), input("x_cont")).allclose(*fastai_logits.find("tabular"), 1e-4, 1e-4));
  // fastlearn -> fastai: models of our own (other weights), under fastai's names
  torch::manual_seed(5);
  auto ours = fl::models::vision_model({.arch = "resnet18", .classes = 3});
  auto our_table = tabular();
  ours->eval();
  our_table->eval();
  fl::save_safetensors(dir_ / "fastlearn_vision.safetensors", fl::models::fastai_vision_state_dict(*ours));
  fl::save_safetensors(dir_ / "fastlearn_tabular.safetensors", fl::models::model_tensors(*our_table));
  fl::save_safetensors(
      dir_ / "fastlearn_logits.safetensors",
      {{"vision", ours->forward(input("image"))}, {"tabular", our_table->forward(input("x_cat"), input("x_cont"))}});
  const auto [code, output] = fastlearn::testing::run_shell(
      fmt::format("'{}' -W ignore '{}/tests/python/fastai_models_oracle.py' '{}' --check 2>&1", FASTLEARN_PYTHON,
                  FASTLEARN_SOURCE_DIR, dir_.string()));
  EXPECT_EQ(code, 0) << output;
}

TEST_F(FastaiModels, NamesOutsideTheMapAreNamed) {
  EXPECT_EQ(fl::models::fastai_vision_name("0.layer2.1.conv1.weight"), "0.5.1.conv1.weight");
  EXPECT_EQ(fl::models::fastlearn_vision_name("1.8.weight"), "1.7.weight");
  const auto message = fastlearn::testing::message_of([] { fl::models::fastlearn_vision_name("2.0.weight"); });
  EXPECT_NE(message.find("'2.0.weight'"), std::string::npos) << message;
  auto vision = fl::models::vision_model({.arch = "resnet18", .classes = 3});
  const auto wrong = fastlearn::testing::message_of(
      [&] { fl::models::load_fastai_vision_weights(*vision, dir_ / "tabular.safetensors"); });
  EXPECT_NE(wrong.find("tabular.safetensors"), std::string::npos) << wrong;
}
