// models::torchscript against PyTorch: a residual MLP with LayerNorm and two inputs (features and an int64 index into
// an embedding), scripted in Python (tests/python/torchscript_oracle.py), trained by fastlearn's Learner with AdamW
// over the same 20 batches as torch.optim.AdamW with the same hyper-parameters and norm / bias exemptions: the same
// weights; the same with a scripted loss taking an extra mask tensor (fl::torchscript_loss, the mask a second target).
// Also: the script's names and norm layers, clones of their own, two CPU replicas as one device, train / eval, and
// refusals by name.
#include <fastlearn/config/load_learner.h>
#include <fastlearn/core/error.h>
#include <fastlearn/core/safetensors.h>
#include <fastlearn/distributed/parallel_trainer.h>
#include <fastlearn/learner/learner.h>
#include <fastlearn/learner/loss.h>
#include <fastlearn/learner/torchscript_loss.h>
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
#include <optional>
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
// With `masked`, the targets are {y, mask} and the loss is the script masked_mse.pt (unless `loss` is given).
std::unique_ptr<fl::Learner> learner_of(const fs::path& dir, bool masked = false, std::optional<fl::Loss> loss = {},
                                        bool cuda_graph = false) {
  auto data = tensors_of(dir / "batches.safetensors");
  std::vector<at::Tensor> targets{data.at("y")};
  if (masked) targets.push_back(data.at("mask"));
  auto items =
      std::make_shared<fl::TensorDataset>(std::vector<at::Tensor>{data.at("x"), data.at("idx")}, std::move(targets));
  auto model = fl::models::torchscript(dir / "model.pt");
  return std::make_unique<fl::Learner>(
      fl::DataLoaders(fl::DataLoader(items, {.bs = 16}), fl::DataLoader(items, {.bs = 64}), 1), model,
      loss ? *loss : (masked ? fl::torchscript_loss(dir / "masked_mse.pt") : fl::mse_loss()),
      fl::LearnerOptions{.opt_func = fl::AdamW(), .progress = false, .cuda_graph = cuda_graph});
}

// Every parameter of the learner's script against PyTorch's after the same steps.
void expect_weights_of(fl::Learner& learn, const fs::path& file) {
  const auto trained = tensors_of(file);
  auto& script = dynamic_cast<fl::models::TorchScriptImpl&>(learn.model()).script();
  std::size_t compared = 0;
  for (const auto& p : script.named_parameters()) {
    ASSERT_TRUE(trained.contains(p.name)) << p.name;
    const auto& expected = trained.at(p.name);
    EXPECT_TRUE(p.value.allclose(expected, 1e-5, 1e-5))
        << file.filename() << ": " << p.name << " differs from PyTorch's by "
        << (p.value - expected).abs().max().item<double>();
    ++compared;
  }
  EXPECT_EQ(compared, trained.size());
}

}  // namespace

TEST_F(TorchScriptModel, TrainsAsPyTorchTrainsTheScriptAndKeepsItsNames) {
  // The script's names, its LayerNorms seen as norm layers (no weight decay, like the biases).
  auto learn = learner_of(dir_);
  std::set<std::string> names;
  for (const auto& p : learn->model().named_parameters()) names.insert(p.key());
  EXPECT_TRUE(names.contains("blocks.0.norm.weight")) << fmt::format("{}", fmt::join(names, " "));
  EXPECT_TRUE(names.contains("emb.weight"));
  const auto exempt = fl::norm_bias_params(learn->model());
  EXPECT_EQ(exempt.size(), 4U /*two LayerNorms*/ + 4U /*the Linear layers' biases*/);

  learn->fit(1, 1e-3);  // 20 steps at a constant rate, one per batch
  expect_weights_of(*learn, dir_ / "trained.safetensors");

  // A scripted loss with an extra tensor: the mask is the batches' second target.
  auto masked = learner_of(dir_, /*masked=*/true);
  masked->fit(1, 1e-3);
  expect_weights_of(*masked, dir_ / "trained_masked.safetensors");
  EXPECT_EQ(masked->get_preds().extra_targets.size(), 1U) << "the mask comes back beside the targets";
  // Refused at the first batch, by name: the mask given to a loss that reads one target; a scripted loss that is
  // given fewer tensors than it takes; one that returns a value per row.
  auto refused = [&](bool masked, fl::Loss loss) {
    auto l = learner_of(dir_, masked, std::move(loss));
    return message_of([&] { l->fit(1, 1e-3); });
  };
  const auto unread = refused(true, fl::mse_loss());
  EXPECT_NE(unread.find("loss 'mse_loss' reads one target and the batch has 2"), std::string::npos) << unread;
  const auto too_few = refused(false, fl::torchscript_loss(dir_ / "masked_mse.pt"));
  EXPECT_NE(
      too_few.find("masked_mse.pt: the scripted loss's forward takes 3 tensor(s), and the batch gives 1 output(s) "
                   "of the model and 1 target(s)"),
      std::string::npos)
      << too_few;
  const auto per_row = refused(true, fl::torchscript_loss(dir_ / "per_row_loss.pt"));
  EXPECT_NE(per_row.find("per_row_loss.pt: the scripted loss's forward takes 2 tensor(s)"), std::string::npos)
      << per_row;
  const auto not_scalar = refused(false, fl::torchscript_loss(dir_ / "per_row_loss.pt"));
  EXPECT_NE(not_scalar.find("per_row_loss.pt: the scripted loss returned a tensor of 16 elements, not one scalar"),
            std::string::npos)
      << not_scalar;
  EXPECT_THROW(fl::torchscript_loss(dir_ / "masked_mse.pt", {.activation = "tanh"}), fl::ConfigError);

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

  // Training steps as CUDA graphs: this model trains eagerly, and says why.
  auto captured = learner_of(dir_, false, {}, /*cuda_graph=*/true);
  captured->fit(1, 1e-3);
  EXPECT_NE(captured->step_graph_stats().eager_because.find("the model is a TorchScript module"), std::string::npos)
      << captured->step_graph_stats().eager_because;

  // Dropout found where the script does it (a module, or a call in a forward), for ParallelTrainer's warning.
  EXPECT_EQ(model.dropout(), "");
  torch::jit::Module dropping("Dropping");
  dropping.register_attribute("training", c10::BoolType::get(), true);
  dropping.define("def forward(self, x):\n    return torch.dropout(x, 0.5, self.training)\n");
  dropping.save((dir_ / "dropping.pt").string());
  EXPECT_EQ(fl::models::torchscript(dir_ / "dropping.pt")->dropout(), "forward");
  // Batch normalization called in a forward is found as a BatchNorm module is (sync_bn refuses both).
  torch::jit::Module normalizing("Normalizing");
  normalizing.register_attribute("training", c10::BoolType::get(), true);
  for (const char* name : {"w", "b"}) normalizing.register_parameter(name, torch::ones({3}).requires_grad_(), false);
  for (const char* name : {"rm", "rv"}) normalizing.register_buffer(name, torch::ones({3}));
  normalizing.define(
      "def forward(self, x):\n"
      "    return torch.batch_norm(x, self.w, self.b, self.rm, self.rv, self.training, 0.1, 1e-5, False)\n");
  normalizing.save((dir_ / "normalizing.pt").string());
  EXPECT_EQ(fl::models::torchscript(dir_ / "normalizing.pt")->batch_norm(), "forward");
  EXPECT_EQ(model.batch_norm(), "") << "LayerNorm is not batch normalization";

  // An export's script loads without running its code: one that defines __setstate__ is refused by name.
  torch::jit::Module stateful("Stateful");
  stateful.register_parameter("w", torch::ones({3, 1}).requires_grad_(), false);
  stateful.register_attribute("training", c10::BoolType::get(), true);
  stateful.define(
      "def forward(self, x):\n    return x @ self.w\n"
      "def __getstate__(self):\n    return (self.w, self.training)\n"
      "def __setstate__(self, state: Tuple[Tensor, bool]):\n    self.w = state[0]\n    self.training = state[1]\n");
  stateful.save((dir_ / "stateful.pt").string());
  {
    auto items = std::make_shared<fl::TensorDataset>(std::vector<at::Tensor>{torch::randn({8, 3})},
                                                     std::vector<at::Tensor>{torch::randn({8, 1})});
    fl::Learner exporting(fl::DataLoaders(fl::DataLoader(items, {.bs = 4}), fl::DataLoader(items, {.bs = 4}), 1),
                          fl::models::torchscript(dir_ / "stateful.pt"), fl::mse_loss(), {.progress = false});
    const auto file = exporting.export_to(dir_ / "stateful_export.safetensors");
    const auto on_load = message_of([&] { fl::load_learner(file, {.device = torch::kCPU}); });
    EXPECT_NE(on_load.find("defines __setstate__, which runs as it is loaded"), std::string::npos) << on_load;
  }

  // Refused by name: a forward that takes an int, a file that is no script.
  const auto int_arg = message_of([&] { fl::models::torchscript(dir_ / "int_arg.pt"); });
  EXPECT_NE(int_arg.find("int_arg.pt: forward's argument 'n' is a int, not a Tensor"), std::string::npos) << int_arg;
  std::ofstream(dir_ / "text.pt") << "not a script";
  EXPECT_THROW(fl::models::torchscript(dir_ / "text.pt"), fl::CheckpointError);
  EXPECT_THROW(fl::models::torchscript(dir_ / "absent.pt"), fl::CheckpointError);
}
