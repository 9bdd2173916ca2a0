// Weights cross between fastlearn and PyTorch through safetensors: a trained fastlearn model saved by
// Learner::save loads with safetensors.torch.load_file + load_state_dict (strict) into the equivalent
// torch.nn module (tests/python/torch_twins.py), which predicts the same on the same inputs; weights saved
// from Python load with Learner::load and fastlearn predicts what Python did. Both to 1e-5, for
// simple_cnn, the BatchNorm ResNet and conv_net (buffers included). One Python run serves every model. An export
// (learner/export.h) is read by Python's safetensors too: its metadata, and its weights into the twin.
#include <fastlearn/core/safetensors.h>
#include <fastlearn/learner/learner.h>
#include <fastlearn/models/models.h>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>

#include "support/build_paths.h"

namespace fl = fastlearn;
namespace fs = std::filesystem;

namespace {

const std::vector<std::string> kArchs = {"simple_cnn", "resnet", "conv_net"};

std::pair<int, std::string> run(const std::string& command) {
  std::string out;
  FILE* pipe = popen(command.c_str(), "r");
  if (!pipe) return {-1, "popen failed"};
  char buf[4096];
  while (auto n = std::fread(buf, 1, sizeof buf, pipe)) out.append(buf, n);
  return {pclose(pipe), out};
}

// Keep in step with tests/python/torch_twins.py.
torch::nn::Sequential make_model(const std::string& arch) {
  if (arch == "simple_cnn") return fl::models::simple_cnn(3);
  if (arch == "conv_net") return fl::models::conv_net({.widths = {8, 16, 32}, .classes = 3});
  return fl::models::resnet({.widths = {8, 16}, .classes = 3, .stem_width = 8});
}

fl::DataLoaders images(std::int64_t n) {
  auto gen = at::detail::createCPUGenerator(1);
  auto y = at::randint(0, 3, {n}, gen, at::TensorOptions().dtype(at::kLong));
  auto x = at::randn({n, 1, 28, 28}, gen) + y.to(at::kFloat).view({n, 1, 1, 1});
  auto ds = std::make_shared<fl::TensorDataset>(std::vector<at::Tensor>{x}, std::vector<at::Tensor>{y});
  return fl::DataLoaders(fl::DataLoader(ds, {.bs = 8}), fl::DataLoader(ds, {.bs = 8}), 3);
}

at::Tensor predict(torch::nn::Sequential& model, const at::Tensor& x) {
  torch::NoGradGuard no_grad;
  model->eval();
  return model->forward(x);
}

}  // namespace

TEST(SafetensorsRoundTrip, WeightsCrossBetweenFastlearnAndPyTorchBothWays) {
  const std::string python = FASTLEARN_PYTHON;
  if (python.empty()) GTEST_SKIP() << "configured without -DFASTLEARN_PYTHON=<python with torch and safetensors>";
  const auto root = fs::temp_directory_path() / fmt::format("fastlearn-roundtrip-{}", getpid());
  fs::remove_all(root);
  torch::manual_seed(3);
  const auto x = torch::randn({6, 1, 28, 28});

  // fastlearn -> Python: trained weights and BatchNorm statistics (not the initial ones), saved by the Learner.
  for (const auto& arch : kArchs) {
    const auto dir = root / arch;
    auto model = make_model(arch);
    fl::Learner learn(images(32), model, fl::cross_entropy(), {.path = dir, .progress = false});
    learn.fit(1, 3e-3);
    const auto weights = learn.save("fastlearn", {.with_opt = false});
    ASSERT_TRUE(fs::equivalent(weights, dir / "models" / "fastlearn.safetensors")) << weights;
    fl::save_safetensors(dir / "data.safetensors", {{"x", x}, {"preds", predict(model, x)}});
  }
  std::string archs;
  for (const auto& arch : kArchs) archs += " " + arch;
  const auto [status, out] = run(fmt::format("'{}' '{}/tests/python/torch_twins.py' '{}'{} 2>&1", python,
                                             FASTLEARN_SOURCE_DIR, root.string(), archs));
  ASSERT_EQ(status, 0) << out;
  EXPECT_EQ(out, "simple_cnn: OK\nresnet: OK\nconv_net: OK\n");

  // Python -> fastlearn: a twin's random weights and statistics, loaded by Learner::load.
  for (const auto& arch : kArchs) {
    const auto dir = root / arch;
    auto model = make_model(arch);
    fl::Learner learn(images(8), model, fl::cross_entropy(), {.path = dir, .progress = false});
    const auto expected = *fl::load_safetensors(dir / "torch_preds.safetensors").find("preds");
    const auto before = predict(model, x);
    EXPECT_GT((before - expected).abs().max().item<double>(), 1e-2) << arch << ": Python's weights must differ";
    learn.load("from_torch", {.with_opt = false});
    const auto preds = predict(model, x);
    ASSERT_EQ(preds.sizes(), expected.sizes()) << arch;
    // Relative to the logits (up to about 200 with torch's initial weights): the two processes' matrix
    // products may run different MKL kernels (core/mkl_dispatch), whose sums differ in the last bits.
    const double bound = 1e-5 * std::max(1.0, expected.abs().max().item<double>());
    EXPECT_LE((preds - expected).abs().max().item<double>(), bound) << arch;
  }
  if (!HasFailure()) fs::remove_all(root);
}

TEST(SafetensorsRoundTrip, PythonReadsAnExportsMetadataAndWeights) {
  const std::string python = FASTLEARN_PYTHON;
  if (python.empty()) GTEST_SKIP() << "configured without -DFASTLEARN_PYTHON=<python with torch and safetensors>";
  const auto dir = fs::temp_directory_path() / fmt::format("fastlearn-export-python-{}", getpid());
  fs::remove_all(dir);
  auto model = make_model("resnet");
  fl::Learner learn(images(32), model, fl::cross_entropy(), {.path = dir, .progress = false});
  learn.fit(1, 3e-3);
  const auto file = learn.export_to("export.safetensors");
  ASSERT_TRUE(fs::equivalent(file, dir / "export.safetensors")) << file;
  torch::manual_seed(5);
  const auto x = torch::randn({4, 1, 28, 28});
  fl::save_safetensors(dir / "data.safetensors", {{"x", x}, {"preds", predict(model, x)}});
  const auto script = fmt::format(
      "import json, sys; sys.path.insert(0, '{}/tests/python'); import torch, torch_twins\n"
      "from safetensors import safe_open; from safetensors.torch import load_file\n"
      "meta = safe_open('{}', 'pt').metadata(); pipeline = json.loads(meta['pipeline'])\n"
      "print(meta['format'], meta['format_version'], meta['activation'], meta['loss'], meta['model_recipe'] == '',\n"
      "      pipeline['kind'], pipeline['item_shape'], pipeline['c'])\n"
      "twin = torch_twins.resnet(); twin.load_state_dict(load_file('{}'), strict=True); twin.eval()\n"
      "data = load_file('{}'); preds = twin(data['x']).detach()\n"
      "print('same preds', bool((preds - data['preds']).abs().max() <= 1e-5 * max(1.0, float(preds.abs().max()))))\n",
      FASTLEARN_SOURCE_DIR, file.string(), file.string(), (dir / "data.safetensors").string());
  const auto [status, out] = run(fmt::format("'{}' -c \"$(cat <<'EOF'\n{}EOF\n)\" 2>&1", python, script));
  ASSERT_EQ(status, 0) << out;
  EXPECT_EQ(out, "fastlearn-export 1 softmax cross_entropy True tensors [1, 28, 28] 3\nsame preds True\n");
  if (!HasFailure()) fs::remove_all(dir);
}
