// Checkpoints: round trips of model, optimizer and training position; resuming gives the same losses
// as an uninterrupted run; corrupt or mismatched files are clear errors that change nothing.
#include <fastlearn/core/error.h>
#include <fastlearn/learner/learner.h>
#include <fastlearn/learner/recorder.h>
#include <fastlearn/models/models.h>
#include <fastlearn/models/weights.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>
#include <fstream>

#include "support/message_of.h"
#include "support/tiny_tasks.h"

namespace fl = fastlearn;
namespace flt = fastlearn::testing;
namespace fs = std::filesystem;

namespace {

class Checkpoint : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("fastlearn-ckpt-" + std::to_string(getpid()) + "-" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // A classifier with dropout (so the RNG state matters) over shuffled data (so the data order matters).
  std::unique_ptr<fl::Learner> make_learner(std::uint64_t init_seed = 1) {
    torch::manual_seed(init_seed);
    auto dls = flt::classification_data({.n_train = 48, .n_valid = 16, .bs = 8, .seed = 5});
    torch::nn::Sequential model(torch::nn::Linear(4, 16), torch::nn::ReLU(), torch::nn::Dropout(0.2),
                                torch::nn::BatchNorm1d(16), torch::nn::Linear(16, 3));
    return std::make_unique<fl::Learner>(dls, model, fl::cross_entropy(),
                                         fl::LearnerOptions{.path = dir_, .progress = false});
  }

  fs::path dir_;
};

// Records the raw loss of every training batch.
struct LossLog : fl::Callback {
  std::vector<double> losses;
  void after_loss() override {
    if (learn().training) losses.push_back(learn().loss.item<double>());
  }
};

// Cancels the fit after `epoch` finished.
struct StopAfter : fl::Callback {
  explicit StopAfter(int e) : epoch(e) { order = 100; }
  void after_epoch() override {
    if (learn().epoch == epoch) throw fl::CancelFitException();
  }
  int epoch;
};

}  // namespace

TEST_F(Checkpoint, LoadWeightsOfALearnerCheckpointSaysWhatElseItHolds) {
  auto learn = make_learner();
  learn->fit(1, 1e-2);
  const auto file = learn->save("full");
  auto other = make_learner(99);
  const auto error = flt::message_of([&] { fl::models::load_weights(other->model(), file); });
  EXPECT_NE(error.find("the file is a Learner checkpoint: load it with Learner::load, or ignore the prefixes "
                       "\"optimizer/\" and \"rng/\""),
            std::string::npos)
      << error;
  fl::models::load_weights(other->model(), file, {.ignore_prefixes = {"optimizer/", "rng/"}});
  EXPECT_TRUE(flt::same_tensors(flt::snapshot(learn->model()), flt::snapshot(other->model())));
}

TEST_F(Checkpoint, RoundTripRestoresModelAndOptimizerExactly) {
  auto learn = make_learner();
  learn->fit(1, 1e-2);
  const auto file = learn->save("round");
  EXPECT_EQ(file, dir_ / "models" / "round.safetensors");
  const auto weights = flt::snapshot(learn->model());
  std::vector<at::Tensor> opt_state;
  for (auto& [n, t] : learn->opt().state_tensors()) opt_state.push_back(t.clone());

  auto other = make_learner(99);
  EXPECT_FALSE(flt::same_tensors(weights, flt::snapshot(other->model())));
  other->load("round");
  EXPECT_TRUE(flt::same_tensors(weights, flt::snapshot(other->model())));
  std::vector<at::Tensor> loaded_state;
  for (auto& [n, t] : other->opt().state_tensors()) loaded_state.push_back(t.clone());
  EXPECT_TRUE(flt::same_tensors(opt_state, loaded_state));
  EXPECT_EQ(other->opt().step_count(), learn->opt().step_count());
  EXPECT_EQ(other->epochs_completed(), 1);
  EXPECT_EQ(other->dls().train().epoch(), learn->dls().train().epoch());
}

TEST_F(Checkpoint, ResumeGivesTheSameLossesAsAStraightRun) {
  // Straight: 2 epochs of constant-lr fit.
  auto straight_log = std::make_shared<LossLog>();
  auto straight = make_learner();
  straight->fit(2, 1e-2, {.cbs = {straight_log}});
  // Interrupted: 1 epoch, save, load into a new Learner, 1 more epoch.
  auto first = make_learner();
  first->fit(1, 1e-2);
  first->save("after1");
  auto second_log = std::make_shared<LossLog>();
  auto second = make_learner(1234);  // other initial weights and RNG state: the checkpoint must restore them
  second->load("after1");
  second->fit(1, 1e-2, {.cbs = {second_log}});
  ASSERT_EQ(straight_log->losses.size(), 12u);
  ASSERT_EQ(second_log->losses.size(), 6u);
  for (std::size_t i = 0; i < 6; ++i) EXPECT_EQ(second_log->losses[i], straight_log->losses[6 + i]) << "batch " << i;
  EXPECT_TRUE(flt::same_tensors(flt::snapshot(straight->model()), flt::snapshot(second->model())));
}

TEST_F(Checkpoint, ResumedOneCycleMatchesTheUninterruptedSchedule) {
  auto straight_log = std::make_shared<LossLog>();
  auto straight = make_learner();
  straight->fit_one_cycle(3, 1e-2, {.fit = {.cbs = {straight_log}}});

  auto first = make_learner();
  first->fit_one_cycle(3, 1e-2, {.fit = {.cbs = {std::make_shared<StopAfter>(0)}}});
  first->save("cycle");
  auto resumed_log = std::make_shared<LossLog>();
  auto resumed = make_learner(77);
  resumed->load("cycle");
  ASSERT_EQ(resumed->epochs_completed(), 1);
  resumed->fit_one_cycle(3, 1e-2, {.fit = {.cbs = {resumed_log}, .start_epoch = resumed->epochs_completed()}});
  ASSERT_EQ(resumed_log->losses.size(), 12u);
  for (std::size_t i = 0; i < 12; ++i) EXPECT_EQ(resumed_log->losses[i], straight_log->losses[6 + i]) << "batch " << i;
  EXPECT_EQ(resumed->recorder().history().back().valid_loss, straight->recorder().history().back().valid_loss);
}

TEST_F(Checkpoint, WeightsOnlyFileHasPlainModuleNames) {
  auto learn = make_learner();
  learn->fit(1, 1e-2);
  const auto file = learn->save("weights", {.with_opt = false});
  auto content = fl::load_safetensors(file);
  std::vector<std::string> names;
  for (auto& [n, t] : content.tensors) names.push_back(n);
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"0.bias", "0.weight", "3.bias", "3.num_batches_tracked", "3.running_mean",
                                             "3.running_var", "3.weight", "4.bias", "4.weight"}));
  // Loading weights only leaves the optimizer and position alone.
  auto other = make_learner(3);
  other->load("weights");
  EXPECT_TRUE(flt::same_tensors(flt::snapshot(learn->model()), flt::snapshot(other->model())));
  EXPECT_EQ(other->epochs_completed(), 0);
}

TEST_F(Checkpoint, MismatchedModelIsAnErrorNamingTheTensorAndChangesNothing) {
  auto learn = make_learner();
  learn->save("mine");
  torch::manual_seed(0);
  auto dls = flt::classification_data({.n_train = 48, .n_valid = 16, .bs = 8});
  fl::Learner other(dls, fl::models::mlp(4, {16}, 3), fl::cross_entropy(), {.path = dir_, .progress = false});
  const auto before = flt::snapshot(other.model());
  try {
    other.load("mine");
    FAIL() << "expected a CheckpointError";
  } catch (const fl::CheckpointError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("mine.safetensors"), std::string::npos) << msg;
    EXPECT_NE(msg.find("'1.weight'"), std::string::npos) << msg;
  }
  EXPECT_TRUE(flt::same_tensors(before, flt::snapshot(other.model())));

  // Same names, other shapes.
  torch::nn::Sequential wider(torch::nn::Linear(4, 32), torch::nn::ReLU(), torch::nn::Dropout(0.2),
                              torch::nn::BatchNorm1d(32), torch::nn::Linear(32, 3));
  fl::Learner wide(dls, wider, fl::cross_entropy(), {.path = dir_, .progress = false});
  try {
    wide.load("mine");
    FAIL() << "expected a CheckpointError";
  } catch (const fl::CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("'0.weight' has shape [16, 4] in the file but [32, 4] in the model"),
              std::string::npos)
        << e.what();
  }
}

TEST_F(Checkpoint, AModelOfSingleLabelClassesDoesNotLoadForMultiLabelDataOfTheSameNames) {
  const auto data = flt::classification_data({.n_train = 16, .n_valid = 8, .bs = 8});
  const std::vector<std::string> names{"cat", "dog", "owl"};
  auto learner = [&](bool multi_label) {
    torch::manual_seed(1);
    return std::make_unique<fl::Learner>(fl::DataLoaders(data.train(), data.valid(), names, multi_label),
                                         torch::nn::Sequential(torch::nn::Linear(4, 3)), fl::cross_entropy(),
                                         fl::LearnerOptions{.path = dir_, .progress = false});
  };
  (void)learner(false)->save("single", {.with_opt = false});
  const auto error = flt::message_of([&] { learner(true)->load("single", {.with_opt = false}); });
  EXPECT_NE(error.find("the model was trained on single-label data; this data is multi-label"), std::string::npos)
      << error;
  EXPECT_NO_THROW(learner(false)->load("single", {.with_opt = false}));
}

TEST_F(Checkpoint, TruncatedOrMissingFileIsACheckpointError) {
  auto learn = make_learner();
  const auto file = learn->save("full");
  const auto before = flt::snapshot(learn->model());
  const auto size = fs::file_size(file);
  fs::resize_file(file, size / 2);
  EXPECT_THROW(learn->load("full"), fl::CheckpointError);
  EXPECT_TRUE(flt::same_tensors(before, flt::snapshot(learn->model())));
  try {
    learn->load("nope");
    FAIL();
  } catch (const fl::CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("does not exist"), std::string::npos);
  }
}

TEST_F(Checkpoint, SavingReplacesTheOldFileAtomically) {
  auto learn = make_learner();
  const auto file = learn->save("atomic");
  learn->fit(1, 1e-2);
  learn->save("atomic");
  // Only the checkpoint itself is left in the directory: no temporary files.
  std::size_t entries = 0;
  for ([[maybe_unused]] auto& e : fs::directory_iterator(file.parent_path())) ++entries;
  EXPECT_EQ(entries, 1u);
  auto other = make_learner(8);
  other->load("atomic");
  EXPECT_TRUE(flt::same_tensors(flt::snapshot(learn->model()), flt::snapshot(other->model())));
}
