// Collaborative filtering: CollabDataLoaders (batches of codes, fastai's Categorify and split, bad tables refused by
// row), collab_learner's two models trained on planted ratings, predict_rating and recommend, the dot-product model's
// interpretation, and the export of a trained one.
#include <fastlearn/config/load_learner.h>
#include <fastlearn/core/error.h>
#include <fastlearn/core/safetensors.h>
#include <fastlearn/data/collab_dataloaders.h>
#include <fastlearn/learner/collab_interpretation.h>
#include <fastlearn/learner/collab_learner.h>
#include <fastlearn/learner/predict_tabular.h>
#include <fastlearn/models/collab.h>

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "support/message_of.h"
#include "support/tiny_tasks.h"

namespace fl = fastlearn;
namespace flt = fastlearn::testing;
namespace fs = std::filesystem;
using ::testing::HasSubstr;

namespace {

fl::CsvTable table_of(std::string_view text) { return fl::parse_csv(text, "ratings.csv"); }

fl::DataLoaders planted(std::int64_t bs = 32) {
  return fl::CollabDataLoaders::from_table(flt::ratings_table(), {.bs = bs, .shuffle_seed = 0}, "ratings.csv");
}

}  // namespace

TEST(CollabDataLoaders, BatchesHoldTheCodesAloneAndTheRatingsAsFloats) {
  auto dls = planted();
  const auto classes = fl::collab_classes(dls);
  ASSERT_TRUE(classes.has_value());
  EXPECT_EQ(classes->user, "user");
  EXPECT_EQ(classes->item, "item");
  EXPECT_EQ(classes->rating, "rating");
  EXPECT_EQ(classes->users.front(), "#na#");
  EXPECT_TRUE(std::is_sorted(classes->users.begin() + 1, classes->users.end()));
  EXPECT_EQ(dls.c(), 1);
  EXPECT_EQ(dls.valid().n(), 120);  // floor(0.2 * 600)
  const auto batch = dls.train().one_batch();
  ASSERT_EQ(batch.inputs.size(), 1u);
  EXPECT_EQ(batch.inputs[0].sizes(), (std::vector<std::int64_t>{32, 2}));
  EXPECT_EQ(batch.inputs[0].scalar_type(), at::kLong);
  EXPECT_EQ(batch.targets[0].sizes(), (std::vector<std::int64_t>{32, 1}));
  EXPECT_EQ(batch.targets[0].scalar_type(), at::kFloat);
}

TEST(CollabDataLoaders, BadTablesAreRefusedByNameAndRow) {
  const auto message = [](std::string_view text, fl::CollabOptions o = {}) {
    return flt::message_of([&] { fl::CollabDataLoaders::from_table(table_of(text), o, "ratings.csv"); });
  };
  const std::string good = "user,item,rating\nu1,i1,4\nu2,i1,3\nu1,i2,5\nu2,i2,1\nu3,i1,2\n";
  EXPECT_THAT(message(good, {.item = "movie"}), HasSubstr("movie"));
  EXPECT_THAT(message("user,item\nu1,i1\n"), HasSubstr("no rating column given, and the table has 2 column(s)"));
  EXPECT_THAT(message("user,item,rating\nu1,i1,4\nu2,i1,good\nu1,i2,5\nu2,i2,1\nu3,i1,2\n"),
              HasSubstr("row 3, target 'rating': 'good' is not a number"));
  EXPECT_THAT(message("user,item,rating\n"), HasSubstr("ratings.csv: the table has no ratings"));
  EXPECT_THAT(message("user,item,rating\nu1,i1,4\n,i1,3\n"), HasSubstr("row 3, column 'user': the cell is missing"));
  EXPECT_THAT(message(good, {.user = "user", .item = "user"}), HasSubstr("must differ"));
}

TEST(CollabDataLoaders, PredictionsRefuseAUserOrItemTheTrainingRowsLackedByRow) {
  auto dls = planted();
  const auto message = flt::message_of(
      [&] { fl::TabularDataLoaders::test_dl(dls, table_of("user,item\nu1,i1\nu999,i2\n"), "new.csv"); });
  EXPECT_THAT(message,
              HasSubstr("new.csv: row 3, column 'user': 'u999' is not among the 30 values of the training rows"));
  // fastai's validation: an id seen only there is "#na#" (code 0), so that validation losses compare.
  // Each user rates once, so the validation row's user is one the training rows lack; the item is everyone's.
  const auto table = table_of("user,item,rating\nu1,i1,4\nu2,i1,3\nu3,i1,5\nu4,i1,1\nu5,i1,2\n");
  auto split = fl::CollabDataLoaders::from_table(table, {.valid_pct = 0.2, .seed = 0}, "ratings.csv");
  ASSERT_EQ(split.valid().n(), 1);
  const auto valid = split.valid().one_batch().inputs[0];
  EXPECT_EQ(valid[0][0].item<std::int64_t>(), 0) << "the user is #na#";
  EXPECT_EQ(valid[0][1].item<std::int64_t>(), 1) << "the item is i1";
  EXPECT_EQ(fl::tabular_dataset(split)->procs().vocabs()[0].size(), 5u);
}

TEST(CollabLearner, BothModelsLearnPlantedRatingsAndAnswerForUsersAndItems) {
  auto dls = planted();
  for (const bool use_nn : {false, true}) {
    SCOPED_TRACE(use_nn ? "EmbeddingNN" : "EmbeddingDotBias");
    torch::manual_seed(0);
    auto learn = fl::collab_learner(dls, {.n_factors = 8, .use_nn = use_nn, .y_range = std::pair(0.0, 6.0)},
                                    {.progress = false});
    const double before = learn->validate().loss;
    learn->fit_one_cycle(8, 3e-2);
    const double after = learn->validate().loss;
    fmt::print("{}: valid loss {:.3f} -> {:.3f}\n", use_nn ? "EmbeddingNN" : "EmbeddingDotBias", before, after);
    EXPECT_LT(after, (use_nn ? 0.8 : 0.5) * before);

    // predict_rating: the model on that pair's codes, as get_preds gives it for the row.
    const auto classes = *fl::collab_classes(learn->dls());
    const auto x = torch::tensor({{1, 2}}, torch::kLong);
    const double direct = learn->predict_batch({x}).flatten()[0].item<double>();
    EXPECT_NEAR(fl::predict_rating(*learn, classes.users[1], classes.items[2]), direct, 1e-6);
    EXPECT_THAT(flt::message_of([&] { fl::predict_rating(*learn, "nobody", classes.items[1]); }),
                HasSubstr("predict_rating: user 'nobody' is not one of the 30 the training rows have"));

    // recommend: the best items by predicted rating, leaving out what the user rated.
    const auto all = fl::recommend(*learn, classes.users[1], 100);
    ASSERT_EQ(all.size(), classes.items.size() - 1);
    for (std::size_t i = 1; i < all.size(); ++i) EXPECT_GE(all[i - 1].rating, all[i].rating);
    const auto top = fl::recommend(*learn, classes.users[1], 3, {all[0].item, all[2].item, "never-seen"});
    ASSERT_EQ(top.size(), 3u);
    EXPECT_EQ(top[0].item, all[1].item);
    EXPECT_EQ(top[1].item, all[3].item);
    EXPECT_NEAR(top[0].rating, fl::predict_rating(*learn, classes.users[1], all[1].item), 1e-6);
  }
}

TEST(CollabLearner, TheDotModelsBiasesFactorsAndPrincipalComponentsAreReadByName) {
  auto dls = planted();
  torch::manual_seed(0);
  auto learn = fl::collab_learner(dls, {.n_factors = 6, .y_range = std::pair(0.0, 6.0)}, {.progress = false});
  learn->fit_one_cycle(4, 3e-2);
  auto& model = dynamic_cast<fl::models::EmbeddingDotBiasImpl&>(learn->model());
  const auto classes = *fl::collab_classes(learn->dls());
  const std::vector<std::string> items{classes.items[3], classes.items[1]};
  const auto bias = fl::collab_bias(*learn, items);
  EXPECT_FLOAT_EQ(bias[0].item<float>(), model.i_bias->weight[3][0].item<float>());
  EXPECT_FLOAT_EQ(bias[1].item<float>(), model.i_bias->weight[1][0].item<float>());
  EXPECT_TRUE(fl::collab_weight(*learn, {classes.users[2]}, false).equal(model.u_weight->weight.narrow(0, 2, 1)));

  const auto most = fl::items_by_bias(*learn, 5), least = fl::items_by_bias(*learn, 5, false);
  ASSERT_EQ(most.size(), 5u);
  const auto max_bias = model.i_bias->weight.narrow(0, 1, model.i_bias->weight.size(0) - 1).max().item<double>();
  EXPECT_NEAR(most[0].bias, max_bias, 1e-6);
  for (std::size_t i = 1; i < most.size(); ++i) {
    EXPECT_GE(most[i - 1].bias, most[i].bias);
    EXPECT_LE(least[i - 1].bias, least[i].bias);
  }

  // fastai's pca: centred rows on the principal directions; the first component spreads the most, and they are
  // uncorrelated.
  const auto factors = model.i_weight->weight.detach().to(torch::kDouble);
  const auto xy = fl::pca(factors, 2);
  const auto var = xy.var(0);
  EXPECT_GE(var[0].item<double>(), var[1].item<double>());
  EXPECT_NEAR((xy.select(1, 0) * xy.select(1, 1)).sum().item<double>(), 0.0, 1e-9);
  EXPECT_NEAR(var[0].item<double>(),
              at::linalg_svdvals(factors - factors.mean(0))[0].item<double>() *
                  at::linalg_svdvals(factors - factors.mean(0))[0].item<double>() /
                  static_cast<double>(factors.size(0) - 1),
              1e-9);

  const auto svg = fs::temp_directory_path() / fmt::format("fastlearn-collab-{}/factors.svg", ::getpid());
  std::vector<std::string> some(classes.items.begin() + 1, classes.items.begin() + 11);
  some[0] = "i<&>";  // not an item: refused by name
  EXPECT_THAT(flt::message_of([&] { fl::plot_item_factors(*learn, some, svg); }), HasSubstr("'i<&>'"));
  some[0] = classes.items[11];
  fl::plot_item_factors(*learn, some, svg);
  std::stringstream text;
  text << std::ifstream(svg).rdbuf();
  for (const auto& name : some) EXPECT_THAT(text.str(), HasSubstr(">" + name + "</text>"));
  fs::remove_all(svg.parent_path());
}

TEST(CollabLearner, AnExportPredictsTheSameRatingsWithoutTheDataAndRefusesUnknownIdsByRow) {
  const auto dir = fs::temp_directory_path() / fmt::format("fastlearn-collab-export-{}", ::getpid());
  fs::create_directories(dir);
  for (const bool use_nn : {false, true}) {
    SCOPED_TRACE(use_nn ? "EmbeddingNN" : "EmbeddingDotBias");
    torch::manual_seed(0);
    auto learn =
        fl::collab_learner(planted(), {.n_factors = 4, .use_nn = use_nn, .layers = {}, .y_range = std::pair(1.0, 5.0)},
                           {.progress = false});
    learn->fit_one_cycle(2, 1e-2);
    const auto file = learn->export_to(dir / "export.safetensors");
    auto loaded = fl::load_learner(file);
    const auto rows = table_of("user,item,rating\nu3,i7,1\nu1,i2,5\nu12,i40,2\n");
    auto dl = fl::TabularDataLoaders::test_dl(loaded->dls(), rows, "rows.csv");
    auto mine = fl::TabularDataLoaders::test_dl(learn->dls(), rows, "rows.csv");
    EXPECT_TRUE(loaded->get_preds(&dl).preds.equal(learn->get_preds(&mine).preds));
    EXPECT_DOUBLE_EQ(fl::predict_rating(*loaded, "u3", "i7"), fl::predict_rating(*learn, "u3", "i7"));
    const auto predicted = fl::predict_row(*loaded, {{"user", "u1"}, {"item", "i2"}});
    EXPECT_DOUBLE_EQ(predicted.values.at(0).second, fl::predict_rating(*learn, "u1", "i2"));
    EXPECT_THAT(flt::message_of([&] {
                  fl::predict_row(*loaded, {{"user", "u1"}, {"item", "i404"}}, "rows.csv:9");
                }),
                HasSubstr("rows.csv:9: column 'item': 'i404' is not among the 40 values"));
    if (use_nn) continue;
    // What an altered file claims is checked before the model is built: a wider n_factors behind a tensor of no
    // elements, more users than the file holds factors for.
    const auto content = fl::load_safetensors(file);
    const auto altered = [&](const std::string& key, const std::string& from, const std::string& to) {
      auto m = content.metadata;
      m.erase(std::string(fl::kChecksumKey));
      const auto at = m.at(key).find(from);
      EXPECT_NE(at, std::string::npos) << key << " has no " << from;
      m[key].replace(at, from.size(), to);
      auto tensors = content.tensors;
      tensors.emplace_back("x", torch::zeros({0, 1048576}));
      fl::save_checked_safetensors(dir / "altered.safetensors", tensors, m);
      return flt::message_of([&] { fl::load_learner(dir / "altered.safetensors"); });
    };
    EXPECT_THAT(altered("model_recipe", "n_factors = 4", "n_factors = 1048576"),
                HasSubstr("the embedding 'u_weight.weight' of 31 rows of 1048576, which the file does not hold"));
    EXPECT_THAT(altered("pipeline", "\"u1\",", "\"u1\",\"u0\","),
                HasSubstr("the embedding 'u_weight.weight' of 32 rows of 4, which the file does not hold"));
  }
  fs::remove_all(dir);
}
