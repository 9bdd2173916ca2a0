// Training schedules as the Learner applies them: fit_one_cycle and fit_flat_cos against fastai's
// formulas at known points, per-group learning rates, and lr_find (stop rule, suggestion, restore).
#include <fastlearn/core/error.h>
#include <fastlearn/learner/learner.h>
#include <fastlearn/learner/lr_finder.h>
#include <fastlearn/learner/param_scheduler.h>
#include <fastlearn/learner/recorder.h>
#include <fastlearn/models/models.h>
#include <fastlearn/optim/sgd.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <fstream>
#include <numbers>

#include "support/build_paths.h"
#include "support/tiny_tasks.h"

namespace fl = fastlearn;
namespace flt = fastlearn::testing;

namespace {

// fastai's cosine annealing from start to end at pos in [0, 1].
double cos_anneal(double start, double end, double pos) {
  return start + (1 + std::cos(std::numbers::pi * (1 - pos))) * (end - start) / 2;
}

// One-cycle value at pos: warm-up start -> middle over pct, then middle -> end.
double one_cycle(double pct, double start, double middle, double end, double pos) {
  return pos < pct ? cos_anneal(start, middle, pos / pct) : cos_anneal(middle, end, (pos - pct) / (1 - pct));
}

}  // namespace

TEST(Schedule, FitOneCycleFollowsFastaiFormulasEveryBatch) {
  // 4 batches per epoch, 2 epochs: positions 0, 1/8, ..., 7/8.
  auto learn = flt::regression_learner(flt::regression_data({.n_train = 32, .n_valid = 8, .bs = 8}));
  learn->fit_one_cycle(2, 1e-2);
  const auto& lrs = learn->recorder().lrs();
  ASSERT_EQ(lrs.size(), 8u);
  for (std::size_t i = 0; i < lrs.size(); ++i) {
    const double pos = static_cast<double>(i) / 8;
    EXPECT_NEAR(lrs[i], one_cycle(0.25, 1e-2 / 25, 1e-2, 1e-2 / 1e5, pos), 1e-12) << "batch " << i;
  }
  EXPECT_NEAR(lrs[0], 4e-4, 1e-12);  // lr_max / div at the start
  EXPECT_NEAR(lrs[2], 1e-2, 1e-12);  // the peak at pct_start = 0.25
  // Momentum (Adam's beta1) goes the other way: 0.95 -> 0.85 -> 0.95; after the fit it holds the value of
  // the last batch.
  EXPECT_NEAR(learn->opt().hyper("mom", 0), one_cycle(0.25, 0.95, 0.85, 0.95, 7.0 / 8), 1e-12);
}

TEST(Schedule, MomentumScheduleAtKnownPoints) {
  auto learn = flt::regression_learner(flt::regression_data({.n_train = 32, .n_valid = 8, .bs = 8}));
  std::vector<double> moms;
  struct MomProbe : fl::Callback {
    std::vector<double>* out;
    void before_step() override { out->push_back(learn().opt().hyper("mom", 0)); }
  };
  auto probe = std::make_shared<MomProbe>();
  probe->out = &moms;
  probe->order = 70;  // after the scheduler set this batch's values
  learn->fit_one_cycle(2, 1e-2, {.fit = {.cbs = {probe}}});
  ASSERT_EQ(moms.size(), 8u);
  EXPECT_NEAR(moms[0], 0.95, 1e-12);
  EXPECT_NEAR(moms[2], 0.85, 1e-12);
  EXPECT_NEAR(moms[5], one_cycle(0.25, 0.95, 0.85, 0.95, 5.0 / 8), 1e-12);
}

TEST(Schedule, FitFlatCosHoldsThenAnneals) {
  auto learn = flt::regression_learner(flt::regression_data({.n_train = 32, .n_valid = 8, .bs = 8}));
  learn->fit_flat_cos(2, 1e-2);
  const auto& lrs = learn->recorder().lrs();
  ASSERT_EQ(lrs.size(), 8u);
  for (std::size_t i = 0; i < 6; ++i) EXPECT_NEAR(lrs[i], 1e-2, 1e-12) << "flat for 75% of the steps";
  EXPECT_NEAR(lrs[7], cos_anneal(1e-2, 1e-7, (7.0 / 8 - 0.75) / 0.25), 1e-12);
}

TEST(Schedule, DiscriminativeLearningRatesPerGroup) {
  auto dls = flt::classification_data({.n_train = 32, .n_valid = 8, .bs = 8});
  fl::Learner learn(dls, fl::models::mlp(4, {8}, 3), fl::cross_entropy(),
                    {.splitter = fl::models::body_head_split, .progress = false});
  std::vector<std::vector<double>> seen;
  struct Probe : fl::Callback {
    std::vector<std::vector<double>>* out;
    void before_step() override { out->push_back({learn().opt().hyper("lr", 0), learn().opt().hyper("lr", 1)}); }
  };
  auto probe = std::make_shared<Probe>();
  probe->out = &seen;
  probe->order = 70;
  learn.fit_one_cycle(1, fl::LrSpec::slice(1e-4, 1e-2), {.fit = {.cbs = {probe}}});
  ASSERT_FALSE(seen.empty());
  for (const auto& lrs : seen) EXPECT_NEAR(lrs[1] / lrs[0], 100.0, 1e-9);
}

TEST(Schedule, ResumedOneCycleContinuesWhereItStopped) {
  auto learn = flt::regression_learner(flt::regression_data({.n_train = 32, .n_valid = 8, .bs = 8}));
  learn->fit_one_cycle(2, 1e-2, {.fit = {.start_epoch = 1}});
  const auto& lrs = learn->recorder().lrs();
  ASSERT_EQ(lrs.size(), 4u) << "only the second epoch runs";
  for (std::size_t i = 0; i < 4; ++i) {
    EXPECT_NEAR(lrs[i], one_cycle(0.25, 4e-4, 1e-2, 1e-7, (4.0 + static_cast<double>(i)) / 8), 1e-12);
  }
}

TEST(Schedule, ValleySuggestsInsideTheLongestDecrease) {
  // Losses fall from index 2 to 8 (the longest decreasing run), then rise.
  const std::vector<double> losses{5, 6, 4.5, 4, 3.5, 3, 2.5, 2, 1.5, 3, 9};
  std::vector<double> lrs;
  for (std::size_t i = 0; i < losses.size(); ++i) lrs.push_back(std::pow(10.0, -6.0 + static_cast<double>(i)));
  // The longest decreasing subsequence ends at 8 and has 8 points (5, 4.5, ..., 1.5): max_start = 8 - 8 = 0;
  // sections = 8/3, idx = 0 + 2 + 1 = 3.
  EXPECT_DOUBLE_EQ(fl::valley(lrs, losses), lrs[3]);
  EXPECT_THROW(fl::valley({}, {}), fl::Error);
}

// A real curve (tests/data: the README example's lr_find at seed 0) and what fastai 2.8.12's four rules
// suggest on it, recorded from fastai itself.
TEST(Schedule, SuggestionsEqualFastaisOnTheReadmeCurve) {
  std::ifstream in(std::string(FASTLEARN_SOURCE_DIR) + "/tests/data/lr_find_fashion_mnist_seed0.csv");
  ASSERT_TRUE(in) << "tests/data/lr_find_fashion_mnist_seed0.csv";
  std::vector<double> lrs, losses;
  for (std::string line; std::getline(in, line);) {
    if (line.empty() || line[0] == '#' || line == "lr,loss") continue;
    const auto comma = line.find(',');
    lrs.push_back(std::stod(line.substr(0, comma)));
    losses.push_back(std::stod(line.substr(comma + 1)));
  }
  ASSERT_EQ(lrs.size(), 69u);
  EXPECT_NEAR(fl::valley(lrs, losses), 3.981072e-04, 1e-9);
  EXPECT_NEAR(fl::slide(lrs, losses), 3.630781e-03, 1e-8);
  EXPECT_NEAR(fl::minimum(lrs, losses), 5.754399e-03, 1e-8);
  EXPECT_NEAR(fl::steep(lrs, losses), 2.511886e-03, 1e-8);
  for (auto rule : {fl::minimum, fl::steep}) EXPECT_THROW(rule({}, {}), fl::Error);
  EXPECT_THROW(fl::slide({}, {}), fl::Error);
}

TEST(Schedule, LrFindStopsOnDivergenceSuggestsAndRestores) {
  auto learn =
      flt::regression_learner(flt::regression_data({.n_train = 64, .n_valid = 16, .bs = 4}), {.opt_func = fl::SGD()});
  const auto before = flt::snapshot(learn->model());
  const auto dl_epoch = learn->dls().train().epoch();
  const auto plot = std::filesystem::temp_directory_path() / ("fastlearn-lrfind-" + std::to_string(getpid()) + ".svg");
  auto result = learn->lr_find({.start_lr = 1e-5, .end_lr = 100, .num_it = 100, .plot = plot});
  const auto& losses = learn->recorder().losses();
  // Plain SGD on this regression diverges long before lr = 100: the sweep stops early, at the first batch
  // whose smoothed loss exceeds 4x the best one.
  ASSERT_LT(losses.size(), 100u);
  const double best = *std::min_element(losses.begin(), losses.end() - 1);
  EXPECT_GT(losses.back(), 4 * best);
  for (std::size_t i = 0; i + 1 < losses.size(); ++i) {
    EXPECT_LE(losses[i], 4 * *std::min_element(losses.begin(), losses.begin() + static_cast<std::ptrdiff_t>(i) + 1));
  }
  for (double suggestion : {result.valley, result.slide, result.minimum, result.steep}) {
    EXPECT_GT(suggestion, 1e-6);
    EXPECT_LT(suggestion, 100);
  }
  EXPECT_TRUE(flt::same_tensors(before, flt::snapshot(learn->model()))) << "lr_find restores the model";
  EXPECT_EQ(learn->dls().train().epoch(), dl_epoch) << "and the data order";
  ASSERT_TRUE(std::filesystem::exists(plot));
  std::ifstream in(plot);
  std::string svg((std::istreambuf_iterator<char>(in)), {});
  EXPECT_NE(svg.find("<svg"), std::string::npos);
  EXPECT_NE(svg.find("valley"), std::string::npos);
  std::filesystem::remove(plot);
}

TEST(Schedule, LrFindRunsAllIterationsWhenNothingDiverges) {
  auto learn =
      flt::regression_learner(flt::regression_data({.n_train = 32, .n_valid = 8, .bs = 8}), {.opt_func = fl::SGD()});
  auto result = learn->lr_find({.start_lr = 1e-7, .end_lr = 1e-4, .num_it = 20});
  EXPECT_EQ(learn->recorder().losses().size(), 20u) << "num_it batches over several epochs (4 per epoch)";
  EXPECT_NEAR(learn->recorder().lrs().front(), 1e-7, 1e-19);
  EXPECT_NEAR(learn->recorder().lrs().back(), 1e-7 * std::pow(1e3, 19.0 / 20), 1e-15);
  EXPECT_EQ(result.lrs.size(), 20u - 2 - 5);
}
