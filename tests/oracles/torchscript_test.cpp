// models::torchscript against PyTorch: a residual MLP with LayerNorm and two inputs (features and an int64 index into
// an embedding), scripted in Python (tests/python/torchscript_oracle.py), trained by fastlearn's Learner with AdamW
// over the same 20 batches as torch.optim.AdamW with the same hyper-parameters and norm / bias exemptions: the same
// weights. Also: the script's names and norm layers, clones of their own, two CPU replicas as one device, train / eval,
// and refusals by name.
#include <fastlearn/core/error.h>
#include <fastlearn/core/safetensors.h>
#include <fastlearn/distributed/parallel_trainer.h>
#include <fastlearn/learner/learner.h>
#include <fastlearn/learner/loss.h>
#include <fastlearn/models/torchscript.h>
#include <fastlearn/optim/adam.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <gtest/gtest.h>
#include <torch/csrc/jit/api/module.h>
#include <torch/torch.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include "support/message_of.h"
#include "support/python_data.h"

namespace fl = fastlearn;
namespace fs = std::filesystem;
using fastlearn::testing::message_of;

namespace {

class TorchScriptModel : public fastlearn::testing::PythonData<TorchScriptModel> {
 protected:
  static void SetUpTestSuite() {
    make("torchscript", "'{python}' -W ignore '{source}/tests/python/torchscript_oracle.py' '{dir}'");
  }
};

std::map<std::string, at::Tensor> tensors_of(const fs::path& file) {
  std::map<std::string, at::Tensor> out;
  for (auto& [name, t] : fl::load_safetensors(file).tensors) out.emplace(name, t);
  return out;
}

// The Learner over the script and the 20 batches, in order, with AdamW at torch's defaults (lr 1e-3, betas (0.9,
// 0.999), eps 1e-8, decoupled weight decay 0.01) and fastai's exemptions (norm layers and biases: none).
std::unique_ptr<fl::Learner> learner_of(const fs::path& dir) {
  auto data = tensors_of(dir / "batches.safetensors");
  auto items = std::make_shared<fl::TensorDataset>(std::vector<at::Tensor>{data.at("x"), data.at("idx")},
                                                   std::vector<at::Tensor>{data.at("y")});
  auto model = fl::models::torchscript(dir / "model.pt");
  return std::make_unique<fl::Learner>(
      fl::DataLoaders(fl::DataLoader(items, {.bs = 16}), fl::DataLoader(items, {.bs = 64}), 1), model, fl::mse_loss(),
      fl::LearnerOptions{.opt_func = fl::AdamW(), .progress = false});
}

}  // namespace

TEST_F(TorchScriptModel, TrainsAsPyTorchTrainsTheScriptAndKeepsItsNames) {
  // The script's names, its LayerNorms seen as norm layers (no weight decay, like the biases).
  auto learn = learner_of(dir_);
  const auto trained = tensors_of(dir_ / "trained.safetensors");
  std::set<std::string> names;
  for (const auto& p : learn->model().named_parameters()) names.insert(p.key());
  EXPECT_TRUE(names.contains("blocks.0.norm.weight")) << fmt::format("{}", fmt::join(names, " "));
  EXPECT_TRUE(names.contains("emb.weight"));
  const auto exempt = fl::norm_bias_params(learn->model());
  EXPECT_EQ(exempt.size(), 4U /*two LayerNorms*/ + 4U /*the Linear layers' biases*/);

  learn->fit(1, 1e-3);  // 20 steps at a constant rate, one per batch
  auto& script = dynamic_cast<fl::models::TorchScriptImpl&>(learn->model()).script();
  std::size_t compared = 0;
  for (const auto& p : script.named_parameters()) {
    ASSERT_TRUE(trained.contains(p.name)) << p.name;
    const auto& expected = trained.at(p.name);
    EXPECT_TRUE(p.value.allclose(expected, 1e-5, 1e-5))
        << p.name << " differs from PyTorch's by " << (p.value - expected).abs().max().item<double>();
    ++compared;
  }
  EXPECT_EQ(compared, trained.size());

  // A clone holds a script of its own; eval() reaches the script.
  auto& model = dynamic_cast<fl::models::TorchScriptImpl&>(learn->model());
  auto copy = std::dynamic_pointer_cast<fl::models::TorchScriptImpl>(model.clone());
  ASSERT_TRUE(copy);
  const auto first = [](torch::jit::Module& m) { return (*m.named_parameters().begin()).value; };
  const auto before = first(model.script()).clone();
  first(copy->script()).detach().add_(1);
  EXPECT_TRUE(first(model.script()).equal(before)) << "the original's script is its own";
  EXPECT_TRUE(copy->named_parameters()[model.named_parameters().begin()->key()].equal(before + 1))
      << "the clone's registered tensors are its script's";
  model.eval();
  EXPECT_FALSE(model.script().is_training());

  // Two CPU replicas of one process take the steps of one device.
  auto one = learner_of(dir_);
  one->fit(1, 1e-3);
  auto two = learner_of(dir_);
  fl::to_parallel(*two, {torch::kCPU, torch::kCPU});
  two->fit(1, 1e-3);
  const auto a = one->model().parameters(), b = two->model().parameters();
  for (std::size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(a[i].allclose(b[i], 1e-5, 1e-6)) << i;

  // Refused by name: a forward that takes an int, a file that is no script.
  const auto int_arg = message_of([&] { fl::models::torchscript(dir_ / "int_arg.pt"); });
  EXPECT_NE(int_arg.find("int_arg.pt: forward's argument 'n' is a int, not a Tensor"), std::string::npos) << int_arg;
  std::ofstream(dir_ / "text.pt") << "not a script";
  EXPECT_THROW(fl::models::torchscript(dir_ / "text.pt"), fl::CheckpointError);
  EXPECT_THROW(fl::models::torchscript(dir_ / "absent.pt"), fl::CheckpointError);
}
