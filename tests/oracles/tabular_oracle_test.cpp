// fastlearn's tabular procs against fastai's own (tests/python/tabular_procs_oracle.py runs fastai's
// TabularPandas with Categorify, FillMissing and Normalize) on the census-like CSV of scripts/make-census-csv,
// with the same RandomSplitter split (valid_pct 0.2, seed 42).
//
// One difference is on purpose: fastai shrinks text columns to pandas categories over the whole frame, so
// its vocabularies also hold levels that only validation rows have (each gets an embedding row that no
// training row trains). fastlearn fits on the training rows only, as the procs are meant to be: such levels
// are "#na#". So fastai's vocabularies, less their validation-only levels, must equal ours.
#include <fastlearn/data/tabular_dataloaders.h>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <torch/torch.h>
#include <nlohmann/json.hpp>

#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "support/python_data.h"

namespace fl = fastlearn;

namespace {

const std::vector<std::string> kCats{"workclass", "education", "occupation", "native_country", "sex"};
const std::vector<std::string> kConts{"age", "hours_per_week", "capital_gain", "education_num"};

class TabularOracle : public fastlearn::testing::PythonData<TabularOracle> {
 protected:
  static void SetUpTestSuite() {
    make("tabular-oracle",
         "'{python}' '{source}/scripts/make-census-csv' '{dir}/census.csv' --rows 3000 && "
         "'{python}' '{source}/tests/python/tabular_procs_oracle.py' '{dir}/census.csv' '{dir}/fastai.json' "
         "--cat workclass,education,occupation,native_country,sex "
         "--cont age,hours_per_week,capital_gain,education_num --y salary --valid-pct 0.2 --seed 42 --head 50");
  }
};

TEST_F(TabularOracle, ProcsAndProcessedRowsEqualFastaisOnTheTrainingRows) {
  const auto fastai = nlohmann::json::parse(std::ifstream(dir_ / "fastai.json"));
  auto dls = fl::TabularDataLoaders::from_csv(
      dir_ / "census.csv",
      {.y_names = {"salary"}, .cat_names = kCats, .cont_names = kConts, .valid_pct = 0.2, .split_seed = 42});
  const auto& table = *fl::tabular_dataset(dls);
  const auto& procs = table.procs();

  // The same split.
  EXPECT_EQ(dls.valid().n(), static_cast<std::int64_t>(fastai["split"]["valid_idx"].size()));
  EXPECT_EQ(dls.vocab(), fastai["y_vocab"].get<std::vector<std::string>>());

  // The same categorical inputs, `_na` indicators included, in the same order.
  ASSERT_EQ(procs.cat_names(), fastai["cat_names"].get<std::vector<std::string>>());
  ASSERT_EQ(procs.cont_names(), kConts);
  const auto csv = fl::read_csv(dir_ / "census.csv");
  std::set<std::int64_t> train_rows;
  for (std::int64_t r : fastai["split"]["train_idx"]) train_rows.insert(r);
  int valid_only_levels = 0;
  for (std::size_t j = 0; j < procs.cat_names().size(); ++j) {
    const auto& name = procs.cat_names()[j];
    std::vector<std::string> theirs;
    std::set<std::string> in_training;
    if (j < kCats.size()) {
      const auto col = csv.column(name, "census.csv");
      for (auto r : train_rows) in_training.insert(csv.rows[static_cast<std::size_t>(r)][col]);
    }
    for (const auto& level : fastai["categorify"][name]) {
      const auto text =
          level.is_boolean() ? std::string(level.get<bool>() ? "True" : "False") : level.get<std::string>();
      if (j < kCats.size() && text != "#na#" && !in_training.count(text)) {
        ++valid_only_levels;
        continue;
      }
      theirs.push_back(text);
    }
    EXPECT_EQ(procs.vocabs()[j], theirs) << name;
  }
  fmt::print("fastai's vocabularies hold {} level(s) seen only in validation rows\n", valid_only_levels);

  // FillMissing: the same medians for the columns with missing training cells; Normalize: the same
  // statistics (fastai's std has its eps added; fastai computes in float32, hence the tolerance).
  for (std::size_t j = 0; j < kConts.size(); ++j) {
    const auto& name = kConts[j];
    if (fastai["fill_missing"]["fill_values"].contains(name)) {
      EXPECT_NEAR(procs.fill_values()[j], fastai["fill_missing"]["fill_values"][name].get<double>(), 1e-9) << name;
    }
    const double mean = fastai["normalize"]["means"][name], std = fastai["normalize"]["stds"][name];
    EXPECT_NEAR(procs.means()[j], mean, 1e-5 * std::max(1.0, std::abs(mean))) << name;
    EXPECT_NEAR(procs.stds()[j] + 1e-7, std, 1e-5 * std) << name;
  }

  // The processed rows: the same category (by name) and the same normalized values.
  const auto& head = fastai["train_head"];
  std::vector<std::int64_t> rows = head["row_idx"];
  const auto mine = procs.encode(csv, rows, "census.csv");
  for (std::size_t i = 0; i < rows.size(); ++i) {
    for (std::size_t j = 0; j < procs.cat_names().size(); ++j) {
      const auto& level = fastai["categorify"][procs.cat_names()[j]][head["cats"][i][j].get<std::size_t>()];
      const auto text =
          level.is_boolean() ? std::string(level.get<bool>() ? "True" : "False") : level.get<std::string>();
      const auto code = mine.cats[static_cast<std::int64_t>(i)][static_cast<std::int64_t>(j)].item<std::int64_t>();
      EXPECT_EQ(procs.vocabs()[j][static_cast<std::size_t>(code)], text)
          << "row " << rows[i] << " " << procs.cat_names()[j];
    }
    for (std::size_t j = 0; j < kConts.size(); ++j) {
      EXPECT_NEAR(mine.conts[static_cast<std::int64_t>(i)][static_cast<std::int64_t>(j)].item<double>(),
                  head["conts"][i][j].get<double>(), 1e-4)
          << "row " << rows[i] << " " << kConts[j];
    }
  }
}

}  // namespace
