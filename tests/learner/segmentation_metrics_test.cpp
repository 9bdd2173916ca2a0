// Segmentation losses and metrics against fastai's on the same predictions (tests/python/
// fastai_segmentation_metrics_oracle.py), and their sums: added over any split into batches (or ranks) they give the
// whole set's value.
#include <fastlearn/core/error.h>
#include <fastlearn/core/safetensors.h>
#include <fastlearn/learner/segmentation_loss.h>
#include <fastlearn/learner/segmentation_metrics.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>

#include "support/python_data.h"

namespace fl = fastlearn;

namespace {

class FastaiSegmentationMetrics : public fastlearn::testing::PythonData<FastaiSegmentationMetrics> {
 protected:
  static void SetUpTestSuite() {
    make("segmentation-metrics",
         "'{python}' -W ignore '{source}/tests/python/fastai_segmentation_metrics_oracle.py' '{dir}'");
  }
  static at::Tensor batch(const std::string& name) {
    return *fl::load_safetensors(dir_ / "batches.safetensors").find(name);
  }
  static double fastai(const std::string& name) {
    return fl::load_safetensors(dir_ / "fastai.safetensors").find(name)->item<double>();
  }
  // The metric accumulated over the four batches, as a Learner's validation does.
  static double accumulated(fl::Metric& metric, const std::string& prefix = "") {
    metric.reset();
    for (int k = 0; k < 4; ++k) {
      metric.accumulate(batch(prefix + "pred" + std::to_string(k)), batch(prefix + "targ" + std::to_string(k)));
    }
    return metric.value();
  }
};

}  // namespace

TEST_F(FastaiSegmentationMetrics, LossesAndMetricsAreFastais) {
  const auto pred = batch("pred0"), targ = batch("targ0");
  EXPECT_NEAR(fl::pixel_cross_entropy()(pred, targ).item<double>(), fastai("ce"), 1e-6);
  EXPECT_NEAR(fl::dice_loss()(pred, targ).item<double>(), fastai("dice_loss"), 1e-6);
  // fastai's default sum is the mean times the items and the classes
  EXPECT_NEAR(fl::dice_loss()(pred, targ).item<double>() * 4 * 3, fastai("dice_loss_sum"), 1e-5);
  EXPECT_NEAR(fl::cross_entropy_dice(0.5)(pred, targ).item<double>(), fastai("ce") + 0.5 * fastai("dice_loss"), 1e-6);
  EXPECT_TRUE(fl::pixel_cross_entropy().decode(fl::pixel_cross_entropy().activate(pred)).equal(pred.argmax(1)));
  EXPECT_NEAR(accumulated(*fl::dice_multi()), fastai("dice_multi"), 1e-9);
  EXPECT_NEAR(accumulated(*fl::jaccard_coeff_multi()), fastai("jaccard_coeff_multi"), 1e-9);
  EXPECT_NEAR(accumulated(*fl::dice(), "binary_"), fastai("dice"), 1e-9);
  EXPECT_NEAR(accumulated(*fl::jaccard_coeff(), "binary_"), fastai("jaccard_coeff"), 1e-9);
  // foreground_acc: fastai's and ours agree on one batch; over several, ours is the pixel average, fastai's the
  // average of the batches' shares weighted by their item counts
  auto foreground = fl::foreground_acc();
  foreground->accumulate(pred, targ);
  EXPECT_NEAR(foreground->value(), fastai("foreground_acc_batch0"), 1e-6);
  const auto whole = accumulated(*foreground);
  at::Tensor all_pred, all_targ;
  for (int k = 0; k < 4; ++k) {
    all_pred = k ? torch::cat({all_pred, batch("pred" + std::to_string(k))}) : batch("pred0");
    all_targ = k ? torch::cat({all_targ, batch("targ" + std::to_string(k))}) : batch("targ0");
  }
  const auto fg = all_targ.ne(0);
  EXPECT_NEAR(whole, all_pred.argmax(1).eq(all_targ).logical_and(fg).sum().item<double>() / fg.sum().item<double>(),
              1e-12);
  EXPECT_GT(std::abs(whole - fastai("foreground_acc")), 1e-4);  // the two definitions differ on these batches
}

TEST(SegmentationMetrics, SumsOfAnySplitAddUpToTheWholeSetsValueAndBadShapesAreRefused) {
  torch::manual_seed(0);
  const auto pred = torch::randn({8, 4, 5, 5}), targ = torch::randint(0, 4, {8, 5, 5});
  for (const auto& make : {fl::dice_multi, fl::jaccard_coeff_multi}) {
    auto whole = make(), first = make(), second = make();
    whole->accumulate(pred, targ);
    first->accumulate(pred.narrow(0, 0, 3), targ.narrow(0, 0, 3));
    second->accumulate(pred.narrow(0, 3, 5), targ.narrow(0, 3, 5));
    auto& sums = dynamic_cast<fl::PixelSumsMetric&>(*first).sums();
    sums += dynamic_cast<fl::PixelSumsMetric&>(*second).sums();  // what a data parallel job's ranks add
    EXPECT_DOUBLE_EQ(first->value(), whole->value()) << whole->name();
  }
  EXPECT_TRUE(std::isnan(fl::dice_multi()->value()));
  EXPECT_THROW(fl::dice()->accumulate(pred, targ), fl::ConfigError);  // four classes: dice takes two
  EXPECT_THROW(fl::dice_multi()->accumulate(pred, targ.narrow(1, 0, 4)), fl::DataError);
  EXPECT_THROW(fl::dice_multi()->accumulate(pred, targ + 4), fl::DataError);
  EXPECT_THROW(fl::pixel_cross_entropy()(pred, targ.flatten(1)), fl::DataError);
  EXPECT_THROW(fl::cross_entropy_dice(-1), fl::ConfigError);
}
