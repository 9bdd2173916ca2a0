// Oracle: one epoch of the MLP with SGD gives the same per-batch losses as plain PyTorch in Python,
// started from the same weights (handed over as safetensors). Skips when no Python torch is present.
#include <fastlearn/core/safetensors.h>
#include <fastlearn/learner/learner.h>
#include <fastlearn/models/models.h>
#include <fastlearn/optim/sgd.h>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <torch/torch.h>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <filesystem>

#include "support/build_paths.h"

namespace fl = fastlearn;
namespace fs = std::filesystem;

namespace {

std::string run(const std::string& command) {
  std::string out;
  if (FILE* pipe = popen(command.c_str(), "r")) {
    char buf[4096];
    while (auto n = std::fread(buf, 1, sizeof buf, pipe)) out.append(buf, n);
    if (pclose(pipe) != 0) return "";
  }
  return out;
}

struct LossLog : fl::Callback {
  std::vector<double> losses;
  void after_loss() override {
    if (learn().training) losses.push_back(learn().loss.item<double>());
  }
};

}  // namespace

TEST(Oracle, MlpSgdLossesMatchPyTorchPerBatch) {
  const std::string python = FASTLEARN_PYTHON;
  if (python.empty() || run(python + " -c 'import torch, safetensors' && echo ok").find("ok") == std::string::npos) {
    GTEST_SKIP() << "no Python with torch and safetensors (FASTLEARN_PYTHON='" << python << "')";
  }
  constexpr std::int64_t kItems = 96, kBs = 16;
  constexpr double kLr = 0.1;
  torch::manual_seed(11);
  auto x = torch::randn({kItems, 8});
  // Learnable labels (which of the first two features are positive), so the losses fall within one epoch.
  auto y = x.select(1, 0).gt(0).to(torch::kLong) + x.select(1, 1).gt(0).to(torch::kLong);
  auto model = fl::models::mlp(8, {16}, 3);

  const auto input = fs::temp_directory_path() / ("fastlearn-oracle-" + std::to_string(getpid()) + ".safetensors");
  fl::NamedTensors tensors{{"data/x", x}, {"data/y", y}};
  for (const auto& p : model->named_parameters()) tensors.emplace_back(p.key(), p.value().detach());
  fl::save_safetensors(input, tensors);

  auto train = std::make_shared<fl::TensorDataset>(std::vector<at::Tensor>{x}, std::vector<at::Tensor>{y});
  fl::DataLoaders dls(fl::DataLoader(train, {.bs = kBs}), fl::DataLoader(train, {.bs = kBs}), 3);
  fl::Learner learn(dls, model, fl::cross_entropy(), {.opt_func = fl::SGD({.mom = 0.9}), .progress = false});
  auto log = std::make_shared<LossLog>();
  learn.fit(1, kLr, {.cbs = {log}});

  const auto out = run(fmt::format("{} {}/tests/python/mlp_sgd_oracle.py {} {} {}", python, FASTLEARN_SOURCE_DIR,
                                   input.string(), kBs, kLr));
  fs::remove(input);
  ASSERT_FALSE(out.empty()) << "the Python oracle failed";
  const auto expected = nlohmann::json::parse(out).get<std::vector<double>>();
  ASSERT_EQ(expected.size(), log->losses.size());
  for (std::size_t i = 0; i < expected.size(); ++i) {
    EXPECT_NEAR(log->losses[i], expected[i], 1e-5) << "batch " << i;
  }
  // The losses must actually move, or matching them would prove little.
  EXPECT_LT(log->losses.back(), log->losses.front());
}
