// Tables: the CSV reader, fastai's procs (worked out by hand here; tests/python/tabular_procs_oracle.py checks
// them against fastai itself in tabular_oracle_test), TabularDataLoaders, TabularModel, tabular_learner,
// predict_row, the procs saved in checkpoints, and a CSV that scikit-learn ships.
#include <fastlearn/core/error.h>
#include <fastlearn/core/random.h>
#include <fastlearn/data/csv.h>
#include <fastlearn/data/random_splitter.h>
#include <fastlearn/data/tabular_dataloaders.h>
#include <fastlearn/learner/checkpoint.h>
#include <fastlearn/learner/metrics.h>
#include <fastlearn/learner/predict_tabular.h>
#include <fastlearn/learner/tabular_learner.h>
#include <fastlearn/models/weights.h>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <torch/torch.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "support/message_of.h"
#include "support/processes.h"

namespace fl = fastlearn;
namespace flt = fastlearn::testing;
namespace fs = std::filesystem;

namespace {

const std::vector<std::int64_t> kAll{0, 1, 2, 3, 4, 5};

// Six rows: a text category, a numeric category (sorted as numbers), a continuous column with a gap, a target.
fl::CsvTable six_rows() {
  return fl::parse_csv(
      "city,rooms,area,price\n"
      "Oslo,2,50,low\n"
      "\"Bergen, West\",10,,high\n"
      "Oslo,9,70,high\n"
      ",2,30,low\n"
      "Troms\xC3\xB8,10,NA,low\n"
      "Oslo,9,90,high\n",
      "six.csv");
}

}  // namespace

TEST(Csv, QuotedFieldsEmbeddedLineBreaksSpacesAndOtherDelimiters) {
  const auto t = fl::parse_csv(
      "\xEF\xBB\xBF"
      "a;b;c\r\n\"x;1\"; y ;\"line\nbreak\"\r\n\"say \"\"hi\"\"\";;3\r\n",
      "t.csv", {.delimiter = ';'});
  ASSERT_EQ(t.columns, (std::vector<std::string>{"a", "b", "c"})) << "the byte order mark is dropped";
  ASSERT_EQ(t.rows.size(), 2u);
  EXPECT_EQ(t.rows[0], (std::vector<std::string>{"x;1", " y ", "line\nbreak"})) << "spaces kept, as pandas keeps them";
  EXPECT_EQ(t.rows[1], (std::vector<std::string>{"say \"hi\"", "", "3"}));
  const auto ragged = flt::message_of([] { fl::parse_csv("a,b\n1,2\n3\n", "ragged.csv"); });
  EXPECT_NE(ragged.find("ragged.csv: row 3 has 1 field(s), the first row has 2"), std::string::npos) << ragged;
  const auto later = flt::message_of([] { fl::parse_csv("a,b\n\"x\ny\",2\n3\n", "lines.csv"); });
  EXPECT_NE(later.find("lines.csv: row 3 (line 4) has 1 field(s)"), std::string::npos) << later;
  const auto quote = flt::message_of([] { fl::parse_csv("a,b\n1,\"2\n", "open.csv"); });
  EXPECT_NE(quote.find("open.csv: malformed CSV"), std::string::npos) << quote;
  EXPECT_THROW(fl::parse_csv("", "empty.csv"), fl::DataError);
  const auto latin1 = flt::message_of([] { fl::parse_csv("city\nTroms\xF8\n", "latin1.csv"); });
  EXPECT_NE(latin1.find("latin1.csv: row 2, field 1 ('Troms\\xF8') is not UTF-8 text (byte 0xF8 at offset 5"),
            std::string::npos)
      << latin1;
  EXPECT_EQ(fl::parse_csv("city\nTroms\xC3\xB8\n", "utf8.csv").rows[0][0], "Troms\xC3\xB8");
}

TEST(TabularProcs, CategorifyFillMissingAndNormalizeFitOnTheTrainingRowsOnly) {
  const auto table = six_rows();
  const std::vector<std::int64_t> train{0, 1, 2, 3};  // rows 4 and 5 are for validation
  const auto procs =
      fl::TabularProcs::fit(table, train, {.cat_names = {"city", "rooms"}, .cont_names = {"area"}}, "six.csv");
  EXPECT_EQ(procs.cat_names(), (std::vector<std::string>{"city", "rooms", "area_na"}));
  EXPECT_EQ(procs.vocabs()[0], (std::vector<std::string>{"#na#", "Bergen, West", "Oslo"}));
  EXPECT_EQ(procs.vocabs()[1], (std::vector<std::string>{"#na#", "2", "9", "10"})) << "numbers sort as numbers";
  EXPECT_EQ(procs.vocabs()[2], (std::vector<std::string>{"#na#", "False", "True"}));
  // area over the training rows: 50, missing, 70, 30 -> median 50; filled: 50 50 70 30.
  ASSERT_EQ(procs.fill_values().size(), 1u);
  EXPECT_DOUBLE_EQ(procs.fill_values()[0], 50);
  EXPECT_DOUBLE_EQ(procs.means()[0], 50);
  const double std = std::sqrt((0.0 + 0.0 + 400.0 + 400.0) / 4);  // population std
  EXPECT_DOUBLE_EQ(procs.stds()[0], std);

  const auto all = procs.encode(table, kAll, "six.csv");
  EXPECT_TRUE(torch::equal(all.cats, torch::tensor({{2, 1, 1}, {1, 3, 2}, {2, 2, 1}, {0, 1, 1}, {0, 3, 2}, {2, 2, 1}})))
      << all.cats << "\nmissing and unseen (Tromsø) cities are #na#; NA is missing";
  const auto expected = (torch::tensor({50.0, 50.0, 70.0, 30.0, 50.0, 90.0}) - 50) / (std + 1e-7);
  EXPECT_TRUE(torch::allclose(all.conts.flatten(), expected.to(torch::kFloat)));

  EXPECT_EQ(fl::TabularProcs::from_json(procs.to_json(), "json"), procs);
  EXPECT_THROW(fl::TabularProcs::from_json("{\"procs\": 1}", "bad"), fl::DataError);
  const auto row = procs.encode_row({{"city", "Oslo"}, {"rooms", "9"}});  // area absent: missing
  EXPECT_TRUE(torch::equal(row.cats, torch::tensor({{2, 2, 2}})));
  const auto typo = flt::message_of([&] { procs.encode_row({{"City", "Oslo"}, {"room", "9"}}, "row 7"); });
  EXPECT_EQ(typo,
            "row 7: no input column 'City' (did you mean 'city'?), 'room' (did you mean 'rooms'?); the inputs are "
            "city, rooms, area");
}

// pandas writes an integer column with a missing cell as floats ("1.0", "2.0", "10.0"); fastai reads them as numbers,
// so a row's "1" or "10" is that category. A column of numbers is matched by number, one of text by its exact text.
TEST(TabularProcs, NumericCategoriesMatchByNumber) {
  const auto floats = fl::parse_csv("size\nNA\n2.0\n1.0\n10.0\n1.0\n1\n", "floats.csv");
  const std::vector<std::int64_t> train{0, 1, 2, 3, 4};  // the last row ("1") is for validation
  const auto procs = fl::TabularProcs::fit(floats, train, {.cat_names = {"size"}}, "floats.csv");
  EXPECT_EQ(procs.vocabs()[0], (std::vector<std::string>{"#na#", "1.0", "2.0", "10.0"}));
  const auto code = [](const fl::TabularProcs& p, const std::string& cell) {
    return p.encode_row({{p.cat_columns()[0], cell}}).cats[0][0].item<std::int64_t>();
  };
  for (const auto& [cell, expected] : std::vector<std::pair<std::string, std::int64_t>>{
           {"1", 1}, {"1.0", 1}, {"1e0", 1}, {" 10", 3}, {"10", 3}, {"+2", 2}, {"3", 0}, {"", 0}, {"nan", 0}}) {
    EXPECT_EQ(code(procs, cell), expected) << "'" << cell << "'";
  }
  EXPECT_EQ(procs.encode(floats, std::vector<std::int64_t>{5}, "floats.csv").cats[0][0].item<std::int64_t>(), 1)
      << "a validation row's 1 is the training rows' 1.0";
  // The other way round, and training rows that spell one number two ways: one category, as the first spells it.
  const auto ints = fl::parse_csv("size\n10\n1\n2\n1.0\n1e0\n", "ints.csv");
  const auto int_procs =
      fl::TabularProcs::fit(ints, std::vector<std::int64_t>{0, 1, 2, 3, 4}, {.cat_names = {"size"}}, "ints.csv");
  EXPECT_EQ(int_procs.vocabs()[0], (std::vector<std::string>{"#na#", "1", "2", "10"}));
  EXPECT_EQ(code(int_procs, "1.0"), 1);
  EXPECT_EQ(code(int_procs, "10.0"), 3);
  // A column with text in it matches exactly: "01" and "1" are two categories, "1.0" neither.
  const auto text = fl::parse_csv("code\n01\n1\nx\n", "text.csv");
  const auto text_procs =
      fl::TabularProcs::fit(text, std::vector<std::int64_t>{0, 1, 2}, {.cat_names = {"code"}}, "text.csv");
  EXPECT_EQ(text_procs.vocabs()[0], (std::vector<std::string>{"#na#", "01", "1", "x"}));
  EXPECT_EQ(code(text_procs, "1"), 2);
  EXPECT_EQ(code(text_procs, "1.0"), 0);
  EXPECT_EQ(code(text_procs, "X"), 0);
  // Integer IDs past 2^53 would round to one double: they stay apart, matched by their text (pandas reads them as
  // exact int64).
  const auto ids = fl::parse_csv("id\n12345678901234567\n12345678901234568\n7\n", "ids.csv");
  const auto id_procs =
      fl::TabularProcs::fit(ids, std::vector<std::int64_t>{0, 1, 2}, {.cat_names = {"id"}}, "ids.csv");
  EXPECT_EQ(id_procs.vocabs()[0], (std::vector<std::string>{"#na#", "7", "12345678901234567", "12345678901234568"}));
  EXPECT_EQ(code(id_procs, "12345678901234568"), 3);
  EXPECT_EQ(code(id_procs, "12345678901234566"), 0);
  // A checkpoint's vocabulary from before, which may hold one number twice: its own spellings keep their codes.
  auto json = procs.to_json();
  const std::string vocab = R"(["#na#","1.0","2.0","10.0"])";
  ASSERT_NE(json.find(vocab), std::string::npos) << json;
  json.replace(json.find(vocab), vocab.size(), R"(["#na#","1","1.0","2"])");
  const auto saved = fl::TabularProcs::from_json(json, "old.json");
  EXPECT_EQ(code(saved, "1"), 1);
  EXPECT_EQ(code(saved, "1.0"), 2);
  EXPECT_EQ(code(saved, "1e0"), 1);
  EXPECT_EQ(code(saved, "2.0"), 3);
}

TEST(TabularProcs, ErrorsNameTheFileRowAndColumn) {
  const auto table = fl::parse_csv("x,y\n1,a\nabc,b\n", "t.csv");
  const std::vector<std::int64_t> rows{0, 1};
  const auto text = flt::message_of([&] { fl::TabularProcs::fit(table, rows, {.cont_names = {"x"}}, "t.csv"); });
  EXPECT_NE(text.find("t.csv: row 3, column 'x': 'abc' is not a number"), std::string::npos) << text;
  const auto absent = flt::message_of([&] { fl::TabularProcs::fit(table, rows, {.cont_names = {"z"}}, "t.csv"); });
  EXPECT_NE(absent.find("no column 'z'"), std::string::npos) << absent;
  const auto gap = fl::parse_csv("x\n1\n\n", "gap.csv", {.header = true});
  EXPECT_THROW(
      fl::TabularProcs::fit(gap, std::vector<std::int64_t>{0}, {.cont_names = {"x"}, .procs = {"normalize"}}, "gap.csv")
          .encode(fl::parse_csv("x\nNaN\n", "nan.csv"), std::vector<std::int64_t>{0}, "nan.csv"),
      fl::DataError);
  EXPECT_THROW(fl::TabularProcs::fit(table, rows, {.cat_names = {"y"}, .procs = {"normalize"}}, "t.csv"),
               fl::ConfigError);
  EXPECT_THROW(fl::TabularProcs::fit(table, rows, {.cat_names = {"y"}, .procs = {"standardize"}}, "t.csv"),
               fl::ConfigError);
}

TEST(TabularDataLoaders, SplitsTargetsAndBatches) {
  std::map<std::string, std::vector<std::string>> columns{
      {"city", {"a", "b", "a", "c", "b", "a", "d", "a"}},
      {"size", {"1", "2", "3", "4", "5", "6", "7", "8"}},
      {"label", {"yes", "no", "yes", "no", "yes", "no", "yes", "no"}},
      {"value", {"1.5", "2", "3", "4", "5", "6", "7", "8e0"}},
      {"other", {"0", "0", "0", "0", "0", "0", "0", "0"}}};
  auto dls = fl::TabularDataLoaders::from_columns(
      columns, {.y_names = {"label"}, .cat_names = {"city"}, .cont_names = {"size"}, .valid_idx = {1, 6}, .bs = 3});
  EXPECT_EQ(dls.vocab(), (std::vector<std::string>{"no", "yes"}));
  EXPECT_EQ(dls.train().n(), 6);
  EXPECT_EQ(dls.train().size(), 2) << "training batches are full (drop_last)";
  const auto batch = dls.valid().one_batch();
  ASSERT_EQ(batch.inputs.size(), 2u);
  EXPECT_TRUE(torch::equal(batch.inputs[0], torch::tensor({{2}, {0}}))) << "b, then d (not in training): #na#";
  EXPECT_EQ(batch.inputs[1].sizes(), (std::vector<std::int64_t>{2, 1}));
  EXPECT_TRUE(torch::equal(batch.targets[0], torch::tensor({0, 1})));

  // Two numeric targets: regression, float targets (N, 2).
  auto reg = fl::TabularDataLoaders::from_columns(
      columns, {.y_names = {"value", "size"}, .cat_names = {"city"}, .valid_idx = {0}, .bs = 2});
  EXPECT_TRUE(reg.vocab().empty());
  EXPECT_EQ(reg.c(), 2);
  EXPECT_TRUE(torch::allclose(reg.valid().one_batch().targets[0], torch::tensor({{1.5f, 1.0f}})));

  // The valid_pct split is fastai's RandomSplitter with the same seed.
  auto split = fl::TabularDataLoaders::from_columns(
      columns, {.y_names = {"label"}, .cont_names = {"size"}, .valid_pct = 0.25, .split_seed = 7});
  const auto mask = fl::random_valid_mask(8, 0.25, 7, "test");
  std::vector<float> expected;
  for (std::size_t i = 0; i < mask.size(); ++i)
    if (mask[i]) expected.push_back(static_cast<float>(i + 1));
  EXPECT_EQ(split.valid().n(), 2);
  const auto sizes = split.valid().one_batch().inputs[1];
  const auto procs = fl::tabular_dataset(split)->procs();
  const auto raw = sizes.flatten() * (procs.stds()[0] + 1e-7) + procs.means()[0];
  EXPECT_TRUE(torch::allclose(raw, torch::tensor(expected), 1e-4, 1e-4)) << raw;

  // A class only validation rows have is an error naming it; so is a target that is also an input.
  columns["label"][1] = "maybe";
  const auto unseen = flt::message_of([&] {
    fl::TabularDataLoaders::from_columns(columns, {.y_names = {"label"}, .cont_names = {"size"}, .valid_idx = {1}});
  });
  EXPECT_NE(unseen.find("row 3, target 'label': class 'maybe' is not among the training rows' classes"),
            std::string::npos)
      << unseen;
  EXPECT_THROW(fl::TabularDataLoaders::from_columns(columns, {.y_names = {"size"}, .cont_names = {"size"}}),
               fl::ConfigError);
  // A target of numbers made a category: the class that training lacks comes with the way to a regression.
  const auto numbers = flt::message_of([&] {
    fl::TabularDataLoaders::from_columns(
        columns, {.y_names = {"size"}, .cat_names = {"city"}, .regression = false, .valid_idx = {7}});
  });
  EXPECT_NE(numbers.find("row 9, target 'size': class '8' is not among the training rows' classes (1, 2, 3, 4, 5, 6, "
                         "7); the target's values are all numbers: for a regression, set TabularOptions::regression = "
                         "true (data.y_block = \"regression\" in a config)"),
            std::string::npos)
      << numbers;
  EXPECT_EQ(fl::TabularDataLoaders::regression(fl::parse_csv("y,x\n1,2\n2.5,3\n", "t.csv"),
                                               {.y_names = {"y"}, .cont_names = {"x"}, .valid_idx = {0}}, "t.csv"),
            true);
  EXPECT_EQ(fl::TabularDataLoaders::regression(fl::parse_csv("y,x\n1,2\nlow,3\n", "t.csv"),
                                               {.y_names = {"y"}, .cont_names = {"x"}, .valid_idx = {0}}, "t.csv"),
            false);
  EXPECT_EQ(fl::TabularDataLoaders::regression(fl::parse_csv("y,x\nlow,2\n2.5,3\n", "t.csv"),
                                               {.y_names = {"y"}, .cont_names = {"x"}, .valid_idx = {0}}, "t.csv"),
            true)
      << "only the training rows count";
}

// A valid column takes the flags the image CSV takes (csv_flag): true/false, yes/no, 1/0 in any case, and an empty
// cell is a training row; anything else is an error naming the row, the column and what it accepts.
TEST(TabularDataLoaders, AValidColumnTakesTheSameFlagsAsTheImageCsv) {
  std::map<std::string, std::vector<std::string>> columns{
      {"size", {"1", "2", "3", "4", "5", "6", "7", "8"}},
      {"label", {"a", "b", "a", "b", "a", "b", "a", "b"}},
      {"is_valid", {"no", "YES", "", "0", "False", "1", "n0", "true"}}};
  const auto bad = flt::message_of([&] {
    fl::TabularDataLoaders::from_columns(columns,
                                         {.y_names = {"label"}, .cont_names = {"size"}, .valid_col = "is_valid"});
  });
  EXPECT_NE(bad.find("row 8, column 'is_valid': 'n0' is not true/false, yes/no or 1/0 (empty: false)"),
            std::string::npos)
      << bad;
  columns["is_valid"][6] = "No";
  auto dls = fl::TabularDataLoaders::from_columns(
      columns, {.y_names = {"label"}, .cont_names = {"size"}, .valid_col = "is_valid", .bs = 2});
  EXPECT_EQ(dls.valid().n(), 3) << "YES, 1 and true";
  EXPECT_EQ(dls.train().n(), 5);
  EXPECT_EQ(fl::csv_flag("Yes"), std::optional<bool>(true));
  EXPECT_EQ(fl::csv_flag(""), std::optional<bool>(false));
  EXPECT_EQ(fl::csv_flag("2"), std::nullopt);
}

// A continuous cell of 8 MiB that is not a number: the error names the row and the column and quotes a bounded
// excerpt of the cell (its first 80 characters and its length), not the whole cell on one line.
TEST(TabularDataLoaders, AnOversizedCellIsQuotedAsAnExcerpt) {
  std::string big(std::size_t{8} << 20, ' ');
  for (std::size_t i = 0; i < big.size(); ++i) big[i] = "0123456789abcdefghij"[i % 20];
  const auto file = fs::temp_directory_path() / ("fastlearn-tabular-" + std::to_string(::getpid()) + "-big.csv");
  {
    std::ofstream out(file, std::ios::binary);
    out << "x,y\n1,a\n2,b\n" << big << ",a\n4,b\n5,a\n6,b\n";
  }
  const auto text = flt::message_of(
      [&] { fl::TabularDataLoaders::from_csv(file, {.y_names = {"y"}, .cont_names = {"x"}, .valid_idx = {5}}); });
  fs::remove(file);
  EXPECT_NE(text.find("row 4, column 'x': '" + big.substr(0, 80) + "... (8388608 bytes)' is not a number"),
            std::string::npos)
      << text.substr(0, 1000);
  EXPECT_LT(text.size(), 400u) << text.substr(0, 1000);
}

TEST(TabularModel, FastaiLayoutNamesAndEmbeddingSizes) {
  EXPECT_EQ(fl::models::emb_sz_rule(3), 3);
  EXPECT_EQ(fl::models::emb_sz_rule(61), 16);
  EXPECT_EQ(fl::models::emb_sz_rule(100000), 600);
  using EmbSizes = std::vector<std::pair<std::int64_t, std::int64_t>>;
  fl::models::TabularModel model(EmbSizes{{3, 3}, {61, 16}}, std::int64_t{4}, std::int64_t{2},
                                 fl::models::TabularModelOptions{.layers = {200, 100}, .ps = {0.1, 0.0}});
  std::map<std::string, std::vector<std::int64_t>> shapes;
  for (const auto& [name, t] : fl::models::model_tensors(*model)) shapes[name] = t.sizes().vec();
  const std::map<std::string, std::vector<std::int64_t>> expected{{"embeds.0.weight", {3, 3}},
                                                                  {"embeds.1.weight", {61, 16}},
                                                                  {"bn_cont.weight", {4}},
                                                                  {"bn_cont.bias", {4}},
                                                                  {"bn_cont.running_mean", {4}},
                                                                  {"bn_cont.running_var", {4}},
                                                                  {"bn_cont.num_batches_tracked", {}},
                                                                  {"layers.0.0.weight", {200, 23}},
                                                                  {"layers.0.2.weight", {200}},
                                                                  {"layers.0.2.bias", {200}},
                                                                  {"layers.0.2.running_mean", {200}},
                                                                  {"layers.0.2.running_var", {200}},
                                                                  {"layers.0.2.num_batches_tracked", {}},
                                                                  {"layers.1.0.weight", {100, 200}},
                                                                  {"layers.1.2.weight", {100}},
                                                                  {"layers.1.2.bias", {100}},
                                                                  {"layers.1.2.running_mean", {100}},
                                                                  {"layers.1.2.running_var", {100}},
                                                                  {"layers.1.2.num_batches_tracked", {}},
                                                                  {"layers.2.0.weight", {2, 100}},
                                                                  {"layers.2.0.bias", {2}}};
  EXPECT_EQ(shapes, expected);
  model->eval();
  const auto out = model->forward(torch::tensor({{0, 5}, {2, 60}}), torch::randn({2, 4}));
  EXPECT_EQ(out.sizes(), (std::vector<std::int64_t>{2, 2}));
  fl::models::TabularModel ranged(EmbSizes{{3, 2}}, std::int64_t{0}, std::int64_t{1},
                                  fl::models::TabularModelOptions{.layers = {8}, .y_range = std::pair{1.0, 3.0}});
  const auto y = ranged->forward(torch::tensor({{0}, {1}, {2}}), torch::zeros({3, 0}));
  EXPECT_TRUE(y.gt(1).all().item<bool>() && y.lt(3).all().item<bool>());
}

// A table where the class depends on a category and a number; the model must find both.
TEST(TabularLearner, LearnsATablePredictsRowsAndSavesItsProcs) {
  fl::set_seed(0);
  auto gen = at::detail::createCPUGenerator(1);
  const std::int64_t n = 1200;
  const auto kind = at::randint(0, 4, {n}, gen, torch::TensorOptions().dtype(torch::kLong));
  const auto x = at::randn({n}, gen, torch::TensorOptions().dtype(torch::kDouble));
  std::map<std::string, std::vector<std::string>> columns;
  for (std::int64_t i = 0; i < n; ++i) {
    const auto k = kind[i].item<std::int64_t>();
    const double v = x[i].item<double>();
    columns["kind"].push_back(std::string(1, static_cast<char>('p' + k)));
    columns["x"].push_back(i % 10 == 0 ? "" : std::to_string(v));
    // positive when x is above a threshold that depends on the kind
    columns["y"].push_back(v > (k < 2 ? -0.5 : 0.5) ? "pos" : "neg");
  }
  auto dls = fl::TabularDataLoaders::from_columns(
      columns, {.y_names = {"y"}, .cat_names = {"kind"}, .cont_names = {"x"}, .bs = 64, .seed = 0});
  auto learn = fl::tabular_learner(dls, {.layers = {32, 16}}, {.metrics = {fl::accuracy()}, .progress = false});
  learn->fit_one_cycle(8, 1e-2);
  const auto result = learn->validate();
  EXPECT_GT(result.metric("accuracy"), 0.85) << "loss " << result.loss;

  const auto p = fl::predict_row(*learn, {{"kind", "p"}, {"x", "2.5"}});
  ASSERT_EQ(p.values.size(), 1u);
  EXPECT_EQ(p.values[0].first, "pos");
  EXPECT_GT(p.values[0].second, 0.5);
  EXPECT_EQ(fl::predict_row(*learn, {{"kind", "s"}, {"x", "-2"}}).values[0].first, "neg");
  EXPECT_NE(fl::describe(p).find("pos 0."), std::string::npos) << fl::describe(p);
  EXPECT_THROW(fl::predict_row(*learn, {{"kind", "p"}, {"x", "two"}}), fl::DataError);
  // One row has no row number: errors name the caller's origin and the column.
  const auto two = flt::message_of([&] { fl::predict_row(*learn, {{"kind", "p"}, {"x", "two"}}); });
  EXPECT_EQ(two, "predict_row: column 'x': 'two' is not a number (a continuous column)");
  const auto line = flt::message_of([&] { fl::predict_row(*learn, {{"x", "inf"}}, "rows.csv:5"); });
  EXPECT_EQ(line, "rows.csv:5: column 'x': 'inf' is not a finite number");
  // A column the model does not read is a typo until shown otherwise: an error naming it and the closest input, not a
  // prediction for a row whose cell went missing. The target may come with the row, as in the training table.
  const auto typo = flt::message_of([&] { fl::predict_row(*learn, {{"kinds", "p"}, {"x", "2.5"}}); });
  EXPECT_EQ(typo, "predict_row: no input column 'kinds' (did you mean 'kind'?); the inputs are kind, x");
  EXPECT_THROW(fl::predict_row(*learn, {{"kind", "p"}, {"x", "2.5"}, {"z", "1"}}), fl::DataError);
  EXPECT_EQ(fl::predict_row(*learn, {{"kind", "p"}, {"x", "2.5"}, {"y", "neg"}}).values, p.values);

  // The procs go into the checkpoint; a learner over other data refuses it.
  const auto file = fs::temp_directory_path() / ("fastlearn-tabular-" + std::to_string(::getpid()) + ".safetensors");
  fl::save_checkpoint(*learn, file);
  auto same = fl::tabular_learner(dls, {.layers = {32, 16}}, {.progress = false});
  EXPECT_NO_THROW(fl::load_checkpoint(*same, file));
  columns["x"][3] = "100";  // other statistics
  auto other_dls = fl::TabularDataLoaders::from_columns(
      columns, {.y_names = {"y"}, .cat_names = {"kind"}, .cont_names = {"x"}, .bs = 64, .seed = 0});
  auto other = fl::tabular_learner(other_dls, {.layers = {32, 16}}, {.progress = false});
  EXPECT_THROW(fl::load_checkpoint(*other, file), fl::CheckpointError);
  fs::remove(file);
}

// A CSV that a package ships: scikit-learn's iris.csv (its header row is "150,4,setosa,versicolor,virginica",
// so the columns carry those names; the last one holds the class index).
TEST(TabularLearner, LearnsScikitLearnsIrisCsv) {
  const auto [found, where] = flt::run_shell(fmt::format(
      "'{}' -c 'import os, sklearn.datasets as d; print(os.path.dirname(d.__file__) + \"/data/iris.csv\", end=\"\")'",
      FASTLEARN_PYTHON));
  if (found != 0 || !fs::is_regular_file(where)) GTEST_SKIP() << "scikit-learn's iris.csv is not installed: " << where;
  fl::set_seed(0);
  auto dls = fl::TabularDataLoaders::from_csv(where, {.y_names = {"virginica"},
                                                      .cont_names = {"150", "4", "setosa", "versicolor"},
                                                      .regression = false,
                                                      .valid_pct = 0.2,
                                                      .bs = 16,
                                                      .seed = 0});
  EXPECT_EQ(dls.vocab(), (std::vector<std::string>{"0", "1", "2"}));
  EXPECT_EQ(dls.train().n() + dls.valid().n(), 150);
  auto learn = fl::tabular_learner(dls, {.layers = {32}}, {.metrics = {fl::accuracy()}, .progress = false});
  learn->fit_one_cycle(20, 2e-2);
  EXPECT_GE(learn->validate().metric("accuracy"), 0.9);
}
