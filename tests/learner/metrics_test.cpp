// Metrics: hand-computed small cases, batch-size weighting, whole-set vs per-batch values, F1 with absent
// classes, clone independence, NaN when empty, detached inputs.
#include <fastlearn/core/error.h>
#include <fastlearn/data/dataset.h>
#include <fastlearn/data/image_decode.h>
#include <fastlearn/learner/interpretation.h>
#include <fastlearn/learner/metrics.h>
#include <fastlearn/learner/multi_label_metrics.h>
#include <fastlearn/learner/top_losses_grid.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace fl = fastlearn;

namespace {

// Scores whose argmax over the last dim is `classes`, out of `n` classes.
at::Tensor scores_for(std::vector<std::int64_t> classes, std::int64_t n) {
  auto idx = torch::tensor(classes);
  return torch::one_hot(idx, n).to(torch::kFloat) * 2 + 0.1 * torch::rand({idx.size(0), n});
}

at::Tensor labels(std::vector<std::int64_t> v) { return torch::tensor(v); }
at::Tensor floats(std::vector<float> v) { return torch::tensor(v); }

TEST(Metrics, AccuracyAndErrorRate) {
  auto acc = fl::accuracy();
  auto err = fl::error_rate();
  const auto pred = scores_for({0, 2, 1, 1}, 3);
  const auto targ = labels({0, 1, 1, 1});
  acc->accumulate(pred, targ);
  err->accumulate(pred, targ);
  EXPECT_DOUBLE_EQ(acc->value(), 0.75);
  EXPECT_DOUBLE_EQ(err->value(), 0.25);
  EXPECT_EQ(acc->name(), "accuracy");
  EXPECT_EQ(err->name(), "error_rate");
}

TEST(Metrics, UnevenBatchesAreWeightedByBatchSize) {
  auto acc = fl::accuracy();
  acc->accumulate(scores_for({0, 1}, 3), labels({0, 1}));                          // 2 items, 2 right
  acc->accumulate(scores_for({0, 0, 0, 2, 2, 2}, 3), labels({0, 1, 1, 2, 0, 0}));  // 6 items, 2 right
  EXPECT_DOUBLE_EQ(acc->value(), 4.0 / 8) << "not the mean of the batch accuracies (1 + 1/3) / 2";
  auto err = fl::error_rate();
  err->accumulate(scores_for({0, 1}, 3), labels({0, 1}));
  err->accumulate(scores_for({0, 0, 0, 2, 2, 2}, 3), labels({0, 1, 1, 2, 0, 0}));
  EXPECT_DOUBLE_EQ(err->value(), 0.5);
}

TEST(Metrics, TopKAccuracy) {
  // Scores per row: class order by score, highest first.
  const auto pred = torch::tensor({{0.5, 0.3, 0.2, 0.0}, {0.1, 0.2, 0.3, 0.4}, {0.4, 0.1, 0.3, 0.2}}).to(torch::kFloat);
  const auto targ = labels({1, 1, 2});  // rank 2, rank 3, rank 2
  auto top2 = fl::top_k_accuracy(2);
  top2->accumulate(pred, targ);
  EXPECT_DOUBLE_EQ(top2->value(), 2.0 / 3);
  auto top3 = fl::top_k_accuracy(3);
  top3->accumulate(pred, targ);
  EXPECT_DOUBLE_EQ(top3->value(), 1.0);
  EXPECT_EQ(top3->name(), "top_k_accuracy");
  auto top5 = fl::top_k_accuracy();  // 5 > 4 classes
  EXPECT_THROW(top5->accumulate(pred, targ), fl::ConfigError);
  EXPECT_THROW(fl::top_k_accuracy(0), fl::ConfigError);
}

TEST(Metrics, F1MacroOverPresentClassesAccumulated) {
  // Classes 0, 1, 3 appear; 2 appears nowhere and is excluded. Per class 2TP / (predicted + actual):
  // 0: 2*1 / (2+2) = 1/2, 1: 2*2 / (3+2) = 4/5, 3: 2*1 / (1+2) = 2/3.
  auto f1 = fl::f1_macro();
  f1->accumulate(scores_for({0, 1}, 4), labels({0, 0}));
  f1->accumulate(scores_for({1, 1, 3, 0}, 4), labels({1, 1, 3, 3}));
  EXPECT_NEAR(f1->value(), (0.5 + 0.8 + 2.0 / 3) / 3, 1e-12);
  EXPECT_EQ(f1->name(), "f1_macro");
  // A class predicted but absent from the targets scores 0 (sklearn's zero_division=0):
  // f1_score([0, 0, 1], [0, 2, 1], average="macro") = (2/3 + 1 + 0) / 3.
  f1->reset();
  f1->accumulate(scores_for({0, 2, 1}, 3), labels({0, 0, 1}));
  EXPECT_NEAR(f1->value(), 5.0 / 9, 1e-12);
  // Accumulated over the set: per-batch F1s would average differently.
  f1->reset();
  f1->accumulate(scores_for({0}, 2), labels({0}));
  f1->accumulate(scores_for({0, 1, 1}, 2), labels({1, 1, 1}));
  // 0: 2*1 / (2+1) = 2/3, 1: 2*2 / (2+3) = 4/5.
  EXPECT_NEAR(f1->value(), (2.0 / 3 + 0.8) / 2, 1e-12);
  f1->accumulate(scores_for({0}, 2), labels({-100}));
  EXPECT_THROW(f1->value(), fl::ConfigError);
}

TEST(Metrics, RegressionMetrics) {
  const auto pred = floats({1, 2, 3}).view({3, 1}), targ = floats({2, 2, 5});
  auto m = fl::mse(), a = fl::mae(), r = fl::rmse();
  for (auto& metric : {m, a, r}) metric->accumulate(pred, targ);
  EXPECT_NEAR(m->value(), 5.0 / 3, 1e-7);
  EXPECT_NEAR(a->value(), 1.0, 1e-7);
  EXPECT_NEAR(r->value(), std::sqrt(5.0 / 3), 1e-7);
  EXPECT_EQ(m->name(), "mse");
  EXPECT_EQ(a->name(), "mae");
  EXPECT_EQ(r->name(), "rmse");
  EXPECT_THROW(m->accumulate(floats({1, 2}), floats({1, 2, 3})), fl::ConfigError);
}

TEST(Metrics, RmseIsTheRootOfTheWholeSetMse) {
  auto r = fl::rmse();
  r->accumulate(floats({0, 0}), floats({1, 1}));  // batch MSE 1, RMSE 1
  r->accumulate(floats({0, 0}), floats({3, 3}));  // batch MSE 9, RMSE 3
  EXPECT_NEAR(r->value(), std::sqrt(5.0), 1e-7) << "not the mean of the batch roots, 2";
  auto m = fl::mse();  // uneven batches: (1*1 + 3*9) / 4
  m->accumulate(floats({0}), floats({1}));
  m->accumulate(floats({0, 0, 0}), floats({3, 3, 3}));
  EXPECT_NEAR(m->value(), 7.0, 1e-6);
}

// One batch that fits any of the metrics above: 6 scores per item for classification, 6 items for regression.
// `other` gives a batch with different values.
void feed(fl::Metric& m, bool other = false) {
  const bool regression = m.name() == "mse" || m.name() == "mae" || m.name() == "rmse";
  if (regression)
    m.accumulate(floats({1, 2, 3, 4, 5, 6}), other ? floats({0, 0, 0, 0, 0, 0}) : floats({1, 2, 3, 4, 5, 0}));
  else
    m.accumulate(scores_for({0, 1, 2, 3, 4, 5}, 6), other ? labels({5, 5, 5, 5, 5, 0}) : labels({0, 1, 2, 3, 4, 0}));
}

TEST(Metrics, NaNWhenEmpty) {
  for (const auto& m :
       {fl::accuracy(), fl::error_rate(), fl::top_k_accuracy(), fl::f1_macro(), fl::mse(), fl::mae(), fl::rmse()}) {
    EXPECT_TRUE(std::isnan(m->value())) << m->name();
    feed(*m);
    m->reset();
    EXPECT_TRUE(std::isnan(m->value())) << m->name() << " after reset";
  }
}

TEST(Metrics, CloneIsFreshAndIndependent) {
  for (const auto& m : {fl::accuracy(), fl::f1_macro(), fl::rmse()}) {
    feed(*m);
    const double before = m->value();
    auto c = m->clone();
    EXPECT_EQ(c->name(), m->name());
    EXPECT_TRUE(std::isnan(c->value())) << m->name() << ": a clone starts reset";
    feed(*c, /*other=*/true);
    EXPECT_NE(c->value(), before) << m->name() << ": the test batches do not tell the two apart";
    EXPECT_EQ(m->value(), before) << m->name() << ": accumulating into the clone changed the original";
    m->reset();
    EXPECT_FALSE(std::isnan(c->value())) << m->name() << ": resetting the original reset the clone";
  }
}

TEST(Metrics, InputsAreDetached) {
  auto w = torch::randn({4, 3}, torch::requires_grad());
  const auto pred = w * 2;
  const auto targ = labels({0, 1, 2, 0});
  fl::AvgMetric avg("avg", [](const at::Tensor& p, const at::Tensor&) {
    EXPECT_FALSE(p.requires_grad());
    return p.mean();
  });
  fl::AccumMetric accum("accum", [](const at::Tensor& p, const at::Tensor&) {
    EXPECT_FALSE(p.requires_grad());
    return p.sum().item<double>();
  });
  avg.accumulate(pred, targ);
  accum.accumulate(pred, targ);
  EXPECT_NEAR(avg.value(), (w * 2).mean().item<double>(), 1e-6);
  EXPECT_NEAR(accum.value(), (w * 2).sum().item<double>(), 1e-5);
  // The graph belongs to the caller alone: backward still works and only sees the caller's use.
  pred.sum().backward();
  EXPECT_TRUE(torch::allclose(w.grad(), torch::full({4, 3}, 2.0)));
}

}  // namespace

// Predicted sets {0, 1}, {2}, {} against targets {0}, {1, 2}, {2} (values worked out by hand, as sklearn's
// fbeta_score(average='samples' / 'macro', zero_division=0) gives them).
TEST(MultiLabelMetrics, AccuracyMultiAndFbetaMultiOverTheWholeSet) {
  const auto logits = torch::tensor({{3.0, 3.0, -3.0}, {-3.0, -3.0, 3.0}, {-3.0, -3.0, -3.0}});
  const auto targets = torch::tensor({{1.0, 0.0, 0.0}, {0.0, 1.0, 1.0}, {0.0, 0.0, 1.0}});
  auto value = [&](const fl::MetricPtr& m) {
    m->reset();
    m->accumulate(logits.slice(0, 0, 2), targets.slice(0, 0, 2));  // two batches: the whole set counts
    m->accumulate(logits.slice(0, 2), targets.slice(0, 2));
    return m->value();
  };
  EXPECT_NEAR(value(fl::accuracy_multi()), 6.0 / 9.0, 1e-12);
  EXPECT_NEAR(value(fl::fbeta_multi(2.0)), (5.0 / 6.0 + 5.0 / 9.0 + 0.0) / 3.0, 1e-12);
  EXPECT_NEAR(value(fl::fbeta_multi(2.0, 0.5, "macro")), (1.0 + 0.0 + 5.0 / 9.0) / 3.0, 1e-12);
  EXPECT_NEAR(value(fl::fbeta_multi(1.0)), (2.0 / 3.0 + 2.0 / 3.0 + 0.0) / 3.0, 1e-12);
  EXPECT_EQ(fl::accuracy_multi()->name(), "accuracy_multi");
  EXPECT_THROW(fl::fbeta_multi(0.0), fl::ConfigError);
  EXPECT_THROW(fl::fbeta_multi(1.0, 0.5, "micro"), fl::ConfigError);
}

// Four items of classes a, b, c: two right, one b taken for a, one c taken for a with little confidence.
TEST(ClassificationInterpretation, ConfusionMatrixMostConfusedAndTopLosses) {
  const auto probs = torch::tensor({{0.8, 0.1, 0.1}, {0.6, 0.3, 0.1}, {0.2, 0.7, 0.1}, {0.5, 0.1, 0.4}});
  const auto targets = torch::tensor({0, 1, 1, 2});
  const fl::ClassificationInterpretation interp(probs, targets, {"a", "b", "c"});
  EXPECT_TRUE(torch::equal(interp.confusion_matrix(), torch::tensor({{1, 0, 0}, {1, 1, 0}, {1, 0, 0}})));
  const auto confused = interp.most_confused();
  ASSERT_EQ(confused.size(), 2u);
  EXPECT_EQ(confused[0].actual, "b");
  EXPECT_EQ(confused[0].predicted, "a");
  EXPECT_EQ(confused[1].actual, "c");
  EXPECT_EQ(confused[0].count, 1);
  const auto top = interp.top_losses(2);
  ASSERT_EQ(top.size(), 2u);
  EXPECT_EQ(top[0].index, 1);                      // -log 0.3
  EXPECT_NEAR(top[0].loss, -std::log(0.3), 1e-6);  // the probabilities are float32
  EXPECT_EQ(top[0].predicted, "a");
  EXPECT_NEAR(top[0].probability, 0.6, 1e-6);
  EXPECT_EQ(top[1].index, 3);  // -log 0.4
  EXPECT_EQ(interp.top_losses(10).size(), 4u);
  EXPECT_THROW(fl::ClassificationInterpretation(probs, targets, {"a", "b"}), fl::ConfigError);
}

namespace {

std::vector<std::uint8_t> from_base64(const std::string& text) {
  const std::string digits = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::vector<std::uint8_t> out;
  std::uint32_t bits = 0;
  int held = 0;
  for (char c : text) {
    if (c == '=') break;
    bits = bits << 6 | static_cast<std::uint32_t>(digits.find(c));
    held += 6;
    if (held >= 8) {
      held -= 8;
      out.push_back(static_cast<std::uint8_t>(bits >> held & 0xFF));
    }
  }
  return out;
}

}  // namespace

// The same four items as above, as 3-channel images: the grid shows the worst ones first, each image as the
// dataset gives it, with its predicted and actual class.
TEST(ClassificationInterpretation, TopLossesGridEmbedsTheWorstItemsImagesWithTheirClasses) {
  const auto probs = torch::tensor({{0.8, 0.1, 0.1}, {0.6, 0.3, 0.1}, {0.2, 0.7, 0.1}, {0.5, 0.1, 0.4}});
  const auto targets = torch::tensor({0, 1, 1, 2});
  const fl::ClassificationInterpretation interp(probs, targets, {"a<1>", "b", "c"});
  const auto images = torch::randint(0, 256, {4, 3, 6, 9}, torch::kUInt8);
  const fl::TensorDataset items({images}, {targets});
  const auto file =
      std::filesystem::temp_directory_path() / ("fastlearn-grid-" + std::to_string(::getpid())) / "top.svg";
  fl::save_top_losses_grid(interp, items, 2, file, {.columns = 2});
  std::ifstream in(file);
  const std::string svg((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::string> embedded;
  for (auto at = svg.find("base64,"); at != std::string::npos; at = svg.find("base64,", at + 1)) {
    embedded.push_back(svg.substr(at + 7, svg.find('"', at) - at - 7));
  }
  ASSERT_EQ(embedded.size(), 2u) << svg.substr(0, 600);
  for (std::size_t i = 0; i < 2; ++i) {
    const auto png = from_base64(embedded[i]);
    const std::int64_t item = i == 0 ? 1 : 3;  // the two highest losses, highest first
    EXPECT_TRUE(torch::equal(fl::decode_image(png, "embedded"), images[item])) << "image " << i;
  }
  EXPECT_LT(svg.find("a&lt;1&gt; / b"), svg.find("a&lt;1&gt; / c")) << "class names are escaped, worst first";
  EXPECT_NE(svg.find(">1.20, 0.60 (item 1)<"), std::string::npos) << svg.substr(0, 900);

  const fl::TensorDataset floats({images.to(torch::kFloat)}, {targets});
  EXPECT_THROW(fl::save_top_losses_grid(interp, floats, 2, file), fl::DataError);
  const fl::TensorDataset fewer({images.narrow(0, 0, 2)}, {targets.narrow(0, 0, 2)});
  EXPECT_THROW(fl::save_top_losses_grid(interp, fewer, 2, file), fl::DataError);
  std::filesystem::remove_all(file.parent_path());
}
