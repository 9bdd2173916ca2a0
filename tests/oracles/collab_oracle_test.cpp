// fastlearn's collaborative filtering against fastai's (tests/python/fastai_collab_oracle.py): CollabDataLoaders on
// the same ratings table give fastai's split and vocabularies; fastai's trained EmbeddingDotBias and EmbeddingNN
// state dicts load into collab_learner's models by name and predict fastai's ratings on the validation rows (users and
// items seen only there being "#na#" on both sides); and back: our models, trained a little further, load strictly
// into fastai's and fastai predicts what we predict.
#include <fastlearn/core/safetensors.h>
#include <fastlearn/data/collab_dataloaders.h>
#include <fastlearn/learner/collab_learner.h>
#include <fastlearn/models/weights.h>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <torch/torch.h>
#include <nlohmann/json.hpp>

#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "support/processes.h"
#include "support/python_data.h"

namespace fl = fastlearn;
namespace flt = fastlearn::testing;

namespace {

class CollabOracle : public flt::PythonData<CollabOracle> {
 protected:
  static void SetUpTestSuite() {
    make("collab-oracle", "'{python}' '{source}/tests/python/fastai_collab_oracle.py' make '{dir}'");
  }
};

fl::CollabLearnerOptions options_of(const std::string& kind) {
  if (kind == "dot") return {.n_factors = 5, .y_range = std::pair(0.0, 5.5)};
  return {.use_nn = true, .layers = {20}, .y_range = std::pair(0.0, 5.5)};
}

// Our predictions on the validation rows, by data row (the CSV's, from 0).
std::map<std::int64_t, double> valid_predictions(fl::Learner& learn, const std::vector<std::int64_t>& valid_rows) {
  const auto preds = learn.get_preds().preds.flatten().to(torch::kDouble).contiguous();
  EXPECT_EQ(preds.numel(), static_cast<std::int64_t>(valid_rows.size()));
  std::map<std::int64_t, double> out;
  for (std::size_t i = 0; i < valid_rows.size(); ++i)
    out[valid_rows[i]] = preds[static_cast<std::int64_t>(i)].item<double>();
  return out;
}

}  // namespace

TEST_F(CollabOracle, FastaisWeightsPredictFastaisRatingsHereAndOursPredictOursInFastai) {
  const auto fastai = nlohmann::json::parse(std::ifstream(dir_ / "fastai.json"));
  auto dls = fl::CollabDataLoaders::from_csv(dir_ / "ratings.csv", {.valid_pct = 0.2, .seed = 42});
  const auto classes = fl::collab_classes(dls);
  ASSERT_TRUE(classes.has_value());
  EXPECT_EQ(classes->user, "userId");
  EXPECT_EQ(classes->item, "movieId");
  EXPECT_EQ(classes->users, fastai["users"].get<std::vector<std::string>>());
  EXPECT_EQ(classes->items, fastai["items"].get<std::vector<std::string>>());
  // The same split; ours keeps the table's order, fastai's the permutation's.
  auto theirs = fastai["valid_idx"].get<std::vector<std::int64_t>>();
  std::vector<std::int64_t> valid_rows = theirs;
  std::sort(valid_rows.begin(), valid_rows.end());
  ASSERT_EQ(dls.valid().n(), static_cast<std::int64_t>(valid_rows.size()));
  ASSERT_EQ(dls.train().dataset().size(), fastai["train_idx"].size());

  for (const std::string kind : {"dot", "nn"}) {
    SCOPED_TRACE(kind);
    auto learn = fl::collab_learner(dls, options_of(kind), {.progress = false});
    fl::models::load_weights(learn->model(), dir_ / (kind + ".safetensors"));  // strict: every name is fastai's
    const auto ours = valid_predictions(*learn, valid_rows);
    const auto& expected = fastai[kind + "_preds"];
    for (std::size_t i = 0; i < theirs.size(); ++i)
      ASSERT_NEAR(ours.at(theirs[i]), expected[i].get<double>(), 1e-5) << "data row " << theirs[i];

    // Back: one more epoch here, then fastai predicts with our weights.
    learn->fit_one_cycle(1, 5e-3);
    const auto trained = valid_predictions(*learn, valid_rows);
    ASSERT_GT(std::abs(trained.at(theirs[0]) - ours.at(theirs[0])), 1e-4) << "training changed nothing";
    const auto weights = dir_ / ("ours_" + kind + ".safetensors");
    fl::save_safetensors(weights, fl::models::model_tensors(learn->model()));
    const auto out = dir_ / ("fastai_with_ours_" + kind + ".json");
    const auto [code, output] = flt::run_shell(
        fmt::format("'{}' '{}/tests/python/fastai_collab_oracle.py' predict '{}' '{}' '{}' {} 2>&1", FASTLEARN_PYTHON,
                    FASTLEARN_SOURCE_DIR, dir_.string(), weights.string(), out.string(), kind));
    ASSERT_EQ(code, 0) << output;
    const auto back = nlohmann::json::parse(std::ifstream(out))["preds"];
    for (std::size_t i = 0; i < theirs.size(); ++i)
      ASSERT_NEAR(back[i].get<double>(), trained.at(theirs[i]), 1e-5) << "data row " << theirs[i];
  }
}
