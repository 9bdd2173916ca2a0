// The configuration of `fastlearn train`: strict validation (the message content is what a user relies
// on), --set overrides with their types, and the resolved config's round trip.
#include <fastlearn/callbacks/mixed_precision.h>
#include <fastlearn/config/learner_from_config.h>
#include <fastlearn/config/train_config.h>

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "support/build_paths.h"

namespace {

using fastlearn::ConfigFileError;
using fastlearn::parse_config;
using fastlearn::to_toml;
using fastlearn::TrainConfig;

// The error parse_config throws for `text` (with `sets`), or a failure when it accepts it.
ConfigFileError error_of(const std::string& text, std::vector<std::string> sets = {}) {
  try {
    parse_config(text, "run.toml", sets);
  } catch (const ConfigFileError& e) {
    return e;
  }
  ADD_FAILURE() << "accepted:\n" << text;
  return ConfigFileError("", "", 0, 0);
}

void expect_contains(const std::string& message, const std::string& part) {
  EXPECT_NE(message.find(part), std::string::npos) << "'" << part << "' not in: " << message;
}

TEST(Config, DefaultsAreTheFashionMnistCnn) {
  const auto c = parse_config("", "empty.toml");
  EXPECT_EQ(c.data.dataset, "fashion_mnist");
  EXPECT_EQ(c.model.arch, "simple_cnn");
  EXPECT_EQ(c.train.loss, "cross_entropy");
  EXPECT_EQ(c.train.metrics, std::vector<std::string>{"accuracy"});
  EXPECT_EQ(c.train.epochs, 3);
}

TEST(Config, AnUnknownKeyIsNamedWithItsLineAndTheClosestValidKey) {
  const auto e = error_of("[train]\nepochs = 3\nlearning_rat = 0.01\n");
  EXPECT_EQ(e.key(), "train.learning_rat");
  EXPECT_EQ(e.line(), 3);
  expect_contains(e.what(), "run.toml:3:1: unknown key train.learning_rat");
  expect_contains(e.what(), "did you mean train.");
  const auto typo = error_of("[train]\nepoch = 3\n");
  expect_contains(typo.what(), "run.toml:2:1: unknown key train.epoch; did you mean train.epochs?");
  expect_contains(typo.what(), "valid keys in [train]: activation, channels_last, cuda_graph, device, epochs, ");
}

TEST(Config, AKeyInTheWrongSectionSuggestsItsSection) {
  const auto e = error_of("[data]\nbs = 64\nepochs = 3\n");
  expect_contains(e.what(), "run.toml:3:1: unknown key data.epochs; did you mean train.epochs?");
  const auto top = error_of("lr = 0.1\n");
  expect_contains(top.what(), "unknown key lr; did you mean train.lr?");
  const auto section = error_of("[trian]\nepochs = 3\n");
  expect_contains(section.what(), "unknown key trian; did you mean train?");
}

TEST(Config, AWrongTypeNamesTheKeyAndWhatIsExpected) {
  const auto e = error_of("[train]\nepochs = \"three\"\n");
  EXPECT_EQ(e.key(), "train.epochs");
  EXPECT_EQ(e.line(), 2);
  expect_contains(e.what(), "run.toml:2:10: train.epochs must be an integer in [1, 1000000], not the string \"three\"");
  expect_contains(error_of("[train]\nepochs = 2.5\n").what(),
                  "train.epochs must be an integer in [1, 1000000], not the float 2.5");
  expect_contains(error_of("[train]\nmixed_precision = 1\n").what(),
                  "train.mixed_precision must be a boolean (true or false), not the integer 1");
  expect_contains(error_of("[model]\narch = \"mlp\"\nhidden = [64, \"x\"]\n").what(),
                  "model.hidden must be an array of integers >= 1, not the string \"x\"");
  expect_contains(error_of("data = 3\n").what(), "data must be a table, not the integer 3");
}

TEST(Config, AnOutOfRangeValueNamesTheKeyAndTheRange) {
  expect_contains(error_of("[data]\nbs = 0\n").what(),
                  "run.toml:2:6: data.bs must be an integer >= 1, not the integer 0");
  expect_contains(error_of("[train]\nlr = -0.1\n").what(), "train.lr must be a number > 0, not the float -0.1");
  expect_contains(error_of("[train]\nlr = nan\n").what(), "train.lr must be a number > 0");
  expect_contains(error_of("[data.transforms]\nrandom_flip = 1.5\n").what(),
                  "data.transforms.random_flip must be a number >= 0 and <= 1, not the float 1.5");
  expect_contains(error_of("[train]\noptimizer = \"adamx\"\n").what(),
                  "train.optimizer must be one of \"adam\", \"adamw\", \"sgd\", not the string \"adamx\"");
  expect_contains(error_of("[train]\nmetrics = [\"accuracy\", \"rmse\"]\n").what(),
                  "train.metrics: unknown metric \"rmse\" for fashion_mnist");
}

TEST(Config, KeysThatDoNotApplyAreErrors) {
  expect_contains(error_of("[model]\nhidden = [64]\n").what(),
                  "model.hidden: applies to arch = \"mlp\" or \"field_cnn\" only");
  expect_contains(error_of("[model]\nwidths = [8]\n").what(),
                  "model.widths: applies to arch = \"resnet\" or \"conv_net\" only");
  expect_contains(error_of("[model]\narch = \"conv_net\"\nstem_width = 8\n").what(),
                  "model.stem_width: applies to arch = \"resnet\" only");
  expect_contains(error_of("[train]\nmomentum = 0.9\n").what(), "train.momentum: applies to optimizer = \"sgd\" only");
  expect_contains(error_of("[data]\ndataset = \"synthetic_regression\"\n[model]\narch = \"simple_cnn\"\n").what(),
                  "model.arch");
  expect_contains(error_of("[data]\ndataset = \"image_folder\"\npath = \"x\"\n[model]\narch = \"simple_cnn\"\n").what(),
                  "\"resnet18\"");
  expect_contains(error_of("[data]\ndataset = \"image_folder\"\n").what(), "data.path: must name the folder");
  expect_contains(error_of("[data]\nsize = 64\n").what(),
                  "data.size: applies to dataset = \"image_folder\", \"image_csv\" or \"segmentation\" only");
  expect_contains(error_of("[data]\nsize = 64\n").what(),
                  "; data.dataset is not set, so it is \"fashion_mnist\" (the default): set it to your data's kind");
  expect_contains(error_of("[data]\ndataset = \"image_folder\"\npath = \"x\"\ncsv = \"a.csv\"\n").what(),
                  "data.csv: applies to dataset = \"image_csv\" only");
  {
    const std::string given = error_of("[data]\ndataset = \"fashion_mnist\"\nsize = 64\n").what();
    EXPECT_EQ(given.find("data.dataset is not set"), std::string::npos) << given;
  }
  expect_contains(error_of("[model]\nweights = \"w.safetensors\"\n").what(),
                  "model.weights: applies to arch = \"resnet18\", \"resnet34\", \"resnet50\" or \"unet\" only");
  expect_contains(error_of("[callbacks.early_stopping]\nmonitor = \"acc\"\n").what(),
                  "callbacks.early_stopping.monitor: \"acc\" is not recorded");
}

// A table of ratings (collaborative filtering): its columns, the two archs and their keys, fastai's defaults.
TEST(Config, RatingsTakeTheCollabArchsWithFastaisDefaults) {
  const std::string ratings = "[data]\ndataset = \"ratings\"\npath = \"r.csv\"\nuser = \"userId\"\n";
  auto c = parse_config(ratings + "[model]\narch = \"collab_nn\"\nn_factors = 12\n", "run.toml");
  EXPECT_EQ(c.model.layers, std::vector<std::int64_t>{12}) << "fastai's EmbeddingNN: one layer of n_factors";
  EXPECT_EQ(fastlearn::task_of(c.data), fastlearn::Task::regression);
  EXPECT_EQ(c.train.loss, "mse");
  EXPECT_EQ(parse_config(to_toml(c), "resolved.toml"), c);
  c = parse_config(ratings + "[model]\narch = \"collab_nn\"\nlayers = [7, 3]\ny_range = [1, 5.5]\n", "run.toml");
  EXPECT_EQ(c.model.layers, (std::vector<std::int64_t>{7, 3}));
  EXPECT_EQ(c.model.y_range, (std::vector<double>{1.0, 5.5}));
  EXPECT_EQ(parse_config(to_toml(c), "resolved.toml"), c);
  EXPECT_EQ(parse_config(ratings, "run.toml").model.arch, "collab");
  expect_contains(error_of(ratings + "[model]\ny_range = [5, 1]\n").what(),
                  "model.y_range: is [low, high] with low < high");
  expect_contains(error_of(ratings + "[model]\ny_range = [0, \"5\"]\n").what(), "an array of numbers");
  expect_contains(error_of(ratings + "[model]\narch = \"tabular\"\n").what(),
                  "must be one of \"collab\", \"collab_nn\"");
  expect_contains(error_of("[data]\ndataset = \"csv\"\npath = \"t.csv\"\nuser = \"u\"\n").what(),
                  "data.user: applies to dataset = \"ratings\" only");
  expect_contains(error_of("[data]\ndataset = \"ratings\"\n").what(), "data.path: must name the CSV file");
}

TEST(Config, CsvTablesNameTheirColumnsAndTakeTheTabularModel) {
  const auto c = parse_config(
      "[data]\ndataset = \"csv\"\npath = \"t.csv\"\ny_names = [\"salary\"]\ncat_names = [\"job\"]\n"
      "cont_names = [\"age\"]\nvalid_col = \"is_valid\"\n[model]\nlayers = [64, 32]\n",
      "run.toml");
  EXPECT_EQ(c.model.arch, "tabular");
  EXPECT_EQ(c.model.layers, (std::vector<std::int64_t>{64, 32}));
  EXPECT_EQ(c.data.procs, (std::vector<std::string>{"categorify", "fill_missing", "normalize"}));
  EXPECT_EQ(c.train.loss, "cross_entropy");
  EXPECT_EQ(c.train.metrics, (std::vector<std::string>{"accuracy"}));
  EXPECT_EQ(parse_config(to_toml(c), "resolved.toml"), c);
  const auto reg = parse_config(
      "[data]\ndataset = \"csv\"\npath = \"t.csv\"\ny_names = [\"a\", \"b\"]\n"
      "cont_names = [\"x\"]\ny_block = \"regression\"\n",
      "run.toml");
  EXPECT_EQ(reg.train.loss, "mse");
  EXPECT_EQ(reg.train.metrics, (std::vector<std::string>{"rmse"}));
  const std::string csv = "[data]\ndataset = \"csv\"\npath = \"t.csv\"\n";
  expect_contains(error_of(csv + "cont_names = [\"x\"]\n").what(),
                  "data.y_names: dataset = \"csv\" needs data.y_names");
  expect_contains(error_of(csv + "y_names = [\"y\"]\n").what(), "needs data.cat_names or data.cont_names");
  expect_contains(error_of(csv + "y_names = [\"y\", \"z\"]\ncont_names = [\"x\"]\ny_block = \"category\"\n").what(),
                  "several targets need y_block = \"regression\"");
  expect_contains(error_of(csv + "y_names = [\"y\"]\ncat_names = [\"c\"]\nprocs = [\"normalize\"]\n").what(),
                  "need the \"categorify\" proc");
  expect_contains(error_of(csv + "y_names = [\"y\"]\ncont_names = [\"x\"]\nprocs = [\"scale\"]\n").what(),
                  "unknown proc \"scale\"");
  expect_contains(
      error_of(csv +
               "y_names = [\"y\"]\ncont_names = [\"x\"]\nprocs = [\"normalize\", \"fill_missing\", \"normalize\"]\n")
          .what(),
      "proc \"normalize\" is listed twice");
  expect_contains(error_of("[data]\ndataset = \"csv\"\ny_names = [\"y\"]\ncont_names = [\"x\"]\n").what(),
                  "data.path: must name the CSV file");
  expect_contains(error_of("[data]\ny_names = [\"y\"]\n").what(), "data.y_names: applies to dataset = \"csv\" only");
  expect_contains(error_of("[model]\nlayers = [8]\n").what(),
                  "model.layers: applies to arch = \"tabular\" or \"collab_nn\" only");
  // Another field delimiter (fastai's from_csv delimiter), for the tables and the image CSV; one character.
  const std::string table = csv + "y_names = [\"y\"]\ncont_names = [\"x\"]\n";
  EXPECT_EQ(parse_config(table + "delimiter = \";\"\n", "run.toml").data.delimiter, ";");
  EXPECT_EQ(parse_config(table, "run.toml").data.delimiter, ",");
  EXPECT_EQ(
      parse_config("[data]\ndataset = \"image_csv\"\npath = \"d\"\ndelimiter = \"\\t\"\n", "run.toml").data.delimiter,
      "\t");
  expect_contains(error_of(table + "delimiter = \";;\"\n").what(), "data.delimiter: must be one character");
  expect_contains(error_of(table + "delimiter = \"\"\n").what(), "data.delimiter: must be one character");
  expect_contains(error_of(table + "delimiter = '\"'\n").what(), "data.delimiter: cannot be a quote");
  expect_contains(error_of("[data]\ndelimiter = \";\"\n").what(),
                  "data.delimiter: applies to dataset = \"image_csv\", \"csv\" or \"ratings\" only");
  const auto spared = parse_config(table + "[train]\nwd_bn_bias = true\n", "run.toml");
  EXPECT_TRUE(spared.train.wd_bn_bias);
  EXPECT_EQ(parse_config(to_toml(spared), "resolved.toml"), spared);
  // train.cuda_graph: a boolean, off by default, written back, and what the Learner is given.
  EXPECT_FALSE(parse_config("", "run.toml").train.cuda_graph);
  const auto graphed = parse_config("[train]\ncuda_graph = true\n", "run.toml");
  EXPECT_TRUE(graphed.train.cuda_graph);
  EXPECT_EQ(parse_config(to_toml(graphed), "resolved.toml"), graphed);
  expect_contains(error_of("[train]\ncuda_graph = \"yes\"\n").what(), "train.cuda_graph");
  // train.mixed_precision_dtype: bf16, fp16 or auto, with mixed precision only.
  const auto bf16 = parse_config("[train]\nmixed_precision = true\nmixed_precision_dtype = \"bf16\"\n", "run.toml");
  EXPECT_EQ(bf16.train.mixed_precision_dtype, "bf16");
  EXPECT_EQ(parse_config(to_toml(bf16), "resolved.toml"), bf16);
  expect_contains(error_of("[train]\nmixed_precision_dtype = \"bf16\"\n").what(),
                  "train.mixed_precision_dtype: applies to mixed_precision = true only");
  expect_contains(error_of("[train]\nmixed_precision = true\nmixed_precision_dtype = \"fp8\"\n").what(),
                  "train.mixed_precision_dtype");
  const auto precision_of = [](const std::string& dtype) {
    auto learn = fastlearn::learner_from_config(
        parse_config("[data]\ndataset = \"synthetic_regression\"\n[model]\narch = \"mlp\"\n[train]\n"
                     "mixed_precision = true\nmixed_precision_dtype = \"" +
                         dtype + "\"\n",
                     "run.toml"),
        {.out = ::testing::TempDir(), .run_callbacks = false, .progress = false});
    return learn->cb<fastlearn::MixedPrecision>()->options().dtype;
  };
  EXPECT_EQ(precision_of("bf16"), at::kBFloat16);
  EXPECT_EQ(precision_of("fp16"), at::kHalf);
  EXPECT_FALSE(precision_of("auto"));
  EXPECT_TRUE(fastlearn::learner_from_config(
                  parse_config("[data]\ndataset = \"synthetic_regression\"\n[model]\narch = \"mlp\"\n[train]\n"
                               "cuda_graph = true\n",
                               "run.toml"),
                  {.out = ::testing::TempDir(), .run_callbacks = false, .progress = false})
                  ->options()
                  .cuda_graph);
}

TEST(Config, ChannelsLastIsTrueFalseOrAutoWhichPicksTheConvModels) {
  using fastlearn::channels_last_on;
  const auto on_for = [](const std::string& text, std::vector<std::string> sets = {}) {
    return channels_last_on(parse_config(text, "run.toml", sets));
  };
  EXPECT_TRUE(on_for(""));  // simple_cnn, channels_last = "auto" by default
  EXPECT_TRUE(on_for("[model]\narch = \"conv_net\"\n[train]\nchannels_last = \"auto\"\n"));
  EXPECT_TRUE(on_for("[model]\narch = \"resnet\"\n"));
  EXPECT_FALSE(on_for("[model]\narch = \"mlp\"\n"));
  EXPECT_FALSE(on_for("[data]\ndataset = \"synthetic_regression\"\n[model]\narch = \"mlp\"\n"));
  EXPECT_FALSE(on_for("", {"train.channels_last=false"}));
  EXPECT_TRUE(on_for("[model]\narch = \"mlp\"\n[train]\nchannels_last = true\n"));
  EXPECT_TRUE(on_for("[train]\nchannels_last = false\n", {"train.channels_last=auto"}));

  auto e = error_of("[train]\nchannels_last = \"yes\"\n");
  EXPECT_EQ(e.key(), "train.channels_last");
  EXPECT_EQ(e.line(), 2);
  expect_contains(e.what(), "train.channels_last must be true, false or \"auto\", not the string");
  expect_contains(error_of("[train]\nchannels_last = 1\n").what(), "must be true, false or \"auto\"");
  expect_contains(to_toml(parse_config("", "run.toml")), "\nchannels_last = \"auto\"\n");
}

TEST(Config, TheDeviceIsAutoCpuCudaOrOneGpu) {
  EXPECT_EQ(parse_config("", "run.toml").train.device, "auto");
  for (const char* device : {"auto", "cpu", "cuda", "cuda:0", "cuda:7"}) {
    const std::vector<std::string> sets{std::string("train.device=") + device};
    EXPECT_EQ(parse_config("", "run.toml", sets).train.device, device);
  }
  for (const char* bad : {"gpu", "cuda:", "cuda:x", "cuda:-1", "CUDA", "cuda:12345", "mps"}) {
    const auto e = error_of(std::string("[train]\ndevice = \"") + bad + "\"\n");
    EXPECT_EQ(e.key(), "train.device") << bad;
    expect_contains(e.what(),
                    R"(must be "auto", "cpu", "cuda" or "cuda:N" (N: a GPU's index), got ")" + std::string(bad) + "\"");
  }
  expect_contains(to_toml(parse_config("", "run.toml")), "\ndevice = \"auto\"\n");
}

TEST(Config, ASyntaxErrorGivesLineAndColumn) {
  const auto e = error_of("[train]\nepochs = 3\nlr = = 0.1\n");
  EXPECT_EQ(e.line(), 3);
  EXPECT_GT(e.column(), 0);
  expect_contains(e.what(), "run.toml:3:");
  expect_contains(e.what(), "TOML syntax error");
}

TEST(Config, SetOverridesKeepTheirTypes) {
  const std::vector<std::string> sets{"train.epochs=5",
                                      "train.lr=1",
                                      "model.arch=resnet",
                                      "model.widths=[8, 16]",
                                      "train.mixed_precision=true",
                                      "data.transforms.random_flip=0.5",
                                      "callbacks.early_stopping.patience=2",
                                      "output.dir=\"runs/x y\""};
  const auto c = parse_config("[train]\nepochs = 3\nlr = 0.003\n", "run.toml", sets);
  EXPECT_EQ(c.train.epochs, 5);
  EXPECT_DOUBLE_EQ(c.train.lr, 1.0);  // an integer is a valid float
  EXPECT_EQ(c.model.arch, "resnet");  // a bare word is a string
  EXPECT_EQ(c.model.widths, (std::vector<std::int64_t>{8, 16}));
  EXPECT_TRUE(c.train.mixed_precision);
  EXPECT_DOUBLE_EQ(c.data.transforms.random_flip, 0.5);
  ASSERT_TRUE(c.callbacks.early_stopping.has_value());
  EXPECT_EQ(c.callbacks.early_stopping->patience, 2);
  EXPECT_EQ(c.output.dir, "runs/x y");
}

TEST(Config, ABadSetNamesTheArgument) {
  const auto e = error_of("", {"train.epochs=5.5"});
  EXPECT_EQ(e.key(), "train.epochs");
  EXPECT_EQ(e.line(), 0);
  expect_contains(e.what(),
                  "--set train.epochs=5.5: train.epochs must be an integer in [1, 1000000], not the float 5.5");
  expect_contains(error_of("", {"train.epochs=\"5\""}).what(), "not the string \"5\"");
  expect_contains(error_of("", {"train.epoch=5"}).what(),
                  "--set train.epoch=5: unknown key train.epoch; did you mean train.epochs?");
  expect_contains(error_of("", {"train.epochs"}).what(), "--set train.epochs: expected key=value");
  expect_contains(error_of("[train]\nepochs = 3\n", {"train.epochs.x=1"}).what(),
                  "train.epochs is the integer 3, not a table");
}

TEST(Config, TheResolvedConfigReadsBackEqual) {
  const std::vector<std::pair<std::string, std::vector<std::string>>> cases{
      {"", {}},
      {"[model]\narch = \"resnet\"\nwidths = [16, 32]\n[callbacks.early_stopping]\nmonitor = \"accuracy\"\n"
       "[callbacks.save_best]\n[train]\nwd = 0.05\nschedule = \"flat_cos\"\nlr = 0.0123456789\n",
       {"data.path=/tmp/a \"quoted\" \\ path", "data.transforms.random_crop_padding=2"}},
      {"[data]\ndataset = \"synthetic_regression\"\n[data.synthetic]\nnoise = 0.3\n[model]\narch = \"mlp\"\n"
       "hidden = []\n[train]\noptimizer = \"sgd\"\nmomentum = 0.8\nschedule = \"constant\"\nloss = \"l1\"\n"
       "metrics = [\"mae\", \"rmse\"]\n",
       {"distributed.timeout_seconds=12.5", "output.checkpoints=false"}},
      {"[model]\narch = \"conv_net\"\nwidths = [32, 64, 128, 256]\n[train]\nchannels_last = true\n", {}},
      {"[model]\narch = \"mlp\"\n[train]\nchannels_last = false\n", {}},
  };
  for (const auto& [text, sets] : cases) {
    const TrainConfig c = parse_config(text, "run.toml", sets);
    const std::string resolved = to_toml(c);
    const TrainConfig back = parse_config(resolved, "config.toml");
    EXPECT_EQ(back, c) << resolved;
    EXPECT_EQ(to_toml(back), resolved);
  }
}

// data.y_block's default is the C++ API's (TabularOptions::regression): the data decides, through the probe the CLI
// gives (it reads the CSV file); the loss and metrics, their defaults and their checks, follow the task it decides.
TEST(Config, ATablesTaskFollowsItsTargetWhenYBlockIsNotGiven) {
  const std::string table =
      "[data]\ndataset = \"csv\"\npath = \"t.csv\"\ny_names = [\"age\"]\ncont_names = [\"x\"]\n[train]\nseed = 7\n";
  int probed = 0;
  const auto numbers = [&](const TrainConfig& c) -> std::optional<bool> {
    ++probed;
    EXPECT_EQ(c.data.path, "t.csv");
    EXPECT_EQ(c.train.seed, 7) << "the split's seed is read before the data is";
    return true;
  };
  const auto regression = parse_config(table, "run.toml", {}, numbers);
  EXPECT_EQ(probed, 1);
  EXPECT_EQ(regression.data.y_block, "regression");
  EXPECT_EQ(regression.train.loss, "mse");
  EXPECT_EQ(regression.train.metrics, (std::vector<std::string>{"rmse"}));
  expect_contains(to_toml(regression), "\ny_block = \"regression\"\n");
  EXPECT_EQ(parse_config(to_toml(regression), "resolved.toml"), regression) << "the resolved config says it";
  const std::vector<std::string> rmse{"train.metrics=[\"rmse\", \"mae\"]"};
  EXPECT_EQ(parse_config(table, "run.toml", rmse, numbers).train.metrics, (std::vector<std::string>{"rmse", "mae"}));

  const auto text = [](const TrainConfig&) -> std::optional<bool> { return false; };
  const auto category = parse_config(table, "run.toml", {}, text);
  EXPECT_EQ(category.data.y_block, "category");
  EXPECT_EQ(category.train.metrics, (std::vector<std::string>{"accuracy"}));
  try {
    parse_config(table, "run.toml", rmse, text);
    ADD_FAILURE() << "rmse for a category";
  } catch (const ConfigFileError& e) {
    expect_contains(e.what(), "train.metrics: unknown metric \"rmse\" for csv with y_block = \"category\"");
    expect_contains(e.what(), "(\"rmse\" needs data.y_block = \"regression\")");
    expect_contains(e.what(), "the target 'age' has training values that are not numbers, so it is a category");
  }

  // A y_block given wins, and several targets are a regression without looking at the data.
  probed = 0;
  EXPECT_EQ(parse_config(table, "run.toml", std::vector<std::string>{"data.y_block=category"}, numbers).data.y_block,
            "category");
  expect_contains(error_of(table, {"data.y_block=category", "train.metrics=[\"rmse\"]"}).what(),
                  "(\"rmse\" needs data.y_block = \"regression\")");
  EXPECT_EQ(
      parse_config(table, "run.toml", std::vector<std::string>{"data.y_names=[\"age\", \"x2\"]"}, numbers).data.y_block,
      "regression");
  EXPECT_EQ(probed, 0);
  // Read on bytes alone (no probe), or when the probe cannot tell (no such file yet), one target is a category.
  EXPECT_EQ(parse_config(table, "run.toml").data.y_block, "category");
  EXPECT_EQ(parse_config(table, "run.toml", {}, [](const TrainConfig&) { return std::optional<bool>(); }).data.y_block,
            "category");
}

TEST(Config, TheResolvedConfigSpellsOutEveryDefault) {
  const auto resolved = to_toml(parse_config("", "run.toml"));
  for (const char* line :
       {"[data]", "dataset = \"fashion_mnist\"", "bs = 128", "[model]", "arch = \"simple_cnn\"", "[train]",
        "epochs = 3", "lr = 0.003", "loss = \"cross_entropy\"", "metrics = [\"accuracy\"]", "[distributed]",
        "sync_bn = true", "bucket_cap_mb = 25.0", "[output]", "dir = \"runs/train\""}) {
    expect_contains(resolved, std::string("\n") + line + "\n");
  }
}

TEST(Config, TheShippedConfigsAreValid) {
  int n = 0;
  for (const auto& entry : std::filesystem::directory_iterator(std::string(FASTLEARN_SOURCE_DIR) + "/configs")) {
    if (entry.path().extension() != ".toml") continue;
    EXPECT_NO_THROW(fastlearn::load_config(entry.path().string())) << entry.path();
    ++n;
  }
  EXPECT_GE(n, 3);
  const auto demo = fastlearn::load_config(std::string(FASTLEARN_SOURCE_DIR) + "/configs/fashion_mnist.toml");
  EXPECT_EQ(demo.model.arch, "simple_cnn");
  const auto resnet = fastlearn::load_config(std::string(FASTLEARN_SOURCE_DIR) + "/configs/fashion_mnist_resnet.toml");
  EXPECT_EQ(resnet.model.arch, "resnet");
  EXPECT_TRUE(resnet.distributed.sync_bn);
}

}  // namespace

// docs/cli.md documents every key of the schema, under its table, and no key that is not in it: the page cannot drift
// from the reader. Its reference has a `### [table]` heading per table and a Markdown row per key whose first cell
// is the key's name in backticks.
TEST(Config, TheCliGuideListsEveryKeyOfTheSchemaAndNoOther) {
  std::map<std::string, std::set<std::string>> schema;  // table -> its keys (sub-tables left out)
  std::istringstream lines(fastlearn::describe_config_keys());
  for (std::string line; std::getline(lines, line);) {
    const auto open = line.find('['), close = line.find(']');
    ASSERT_NE(close, std::string::npos) << line;
    const auto table = line.substr(open + 1, close - open - 1);
    std::istringstream keys(line.substr(close + 1));
    for (std::string key; std::getline(keys, key, ',');) {
      key.erase(0, key.find_first_not_of(' '));
      schema[table].insert(key);
    }
  }
  for (auto& [table, keys] : schema)
    for (auto it = keys.begin(); it != keys.end();)
      it = schema.count(table + "." + *it) ? keys.erase(it) : std::next(it);

  std::ifstream page(std::filesystem::path(FASTLEARN_SOURCE_DIR) / "docs" / "cli.md");
  ASSERT_TRUE(page) << "docs/cli.md";
  std::map<std::string, std::set<std::string>> documented;
  std::string table;
  for (std::string line; std::getline(page, line);) {
    if (line.starts_with("### [") && line.back() == ']') {
      table = line.substr(5, line.size() - 6);
      documented[table];
    } else if (!table.empty() && line.starts_with("| `")) {
      const auto end = line.find('`', 3);
      documented[table].insert(line.substr(3, end - 3));
    } else if (line.starts_with("## ")) {
      table.clear();
    }
  }
  for (const auto& [t, keys] : schema) {
    ASSERT_TRUE(documented.count(t)) << "docs/cli.md has no `### [" << t << "]` section";
    for (const auto& key : keys) EXPECT_TRUE(documented[t].count(key)) << "docs/cli.md lacks " << t << "." << key;
  }
  for (const auto& [t, keys] : documented) {
    ASSERT_TRUE(schema.count(t)) << "docs/cli.md documents a table the schema lacks: [" << t << "]";
    for (const auto& key : keys)
      EXPECT_TRUE(schema.at(t).count(key)) << "docs/cli.md documents " << t << "." << key << ", which the schema lacks";
  }
}

// A path that is not UTF-8 round-trips through the resolved config.toml in fastlearn's byte form; a UTF-8 path with '%'
// in it stays as written; a byte form with a bad escape or a NUL is refused by key.
TEST(Config, PathsThatAreNotUtf8RoundTripInTheByteForm) {
  TrainConfig c;
  c.output.dir = "runs/caf\xe9/100%/\xff\xfe";
  c.data.path = "data/100%/données";
  const auto text = to_toml(c);
  expect_contains(text, "dir = \"\\u0000runs/caf%E9/100%25/%FF%FE\"");
  expect_contains(text, "path = \"data/100%/données\"");
  const auto back = parse_config(text, "resolved.toml");
  EXPECT_EQ(back.output.dir, c.output.dir);
  EXPECT_EQ(back.data.path, c.data.path);
  EXPECT_EQ(back, parse_config(to_toml(back), "again.toml"));
  const auto bad = error_of("[output]\ndir = \"\\u0000runs/caf%E\"\n");
  EXPECT_EQ(bad.key(), "output.dir");
  expect_contains(bad.what(), "'%' at character 9 is not followed by two hex digits");
  expect_contains(error_of("[output]\ndir = \"\\u0000runs/%00\"\n").what(), "a path has no NUL byte");
  expect_contains(error_of("[output]\ndir = \"runs\\u0000x\"\n").what(), "a path has no NUL");
}

TEST(Config, DistributedDevicesAreSpelledAndAtLeastTwo) {
  const auto c = parse_config("[distributed]\ndevices = [\"cpu\", \"cpu\", \"cpu\"]\n", "run.toml");
  EXPECT_EQ(c.distributed.devices, (std::vector<std::string>{"cpu", "cpu", "cpu"}));
  EXPECT_EQ(parse_config(to_toml(c), "resolved.toml"), c);
  EXPECT_TRUE(parse_config("", "run.toml").distributed.devices.empty());
  expect_contains(error_of("[distributed]\ndevices = [\"cpu\"]\n").what(), "give at least two");
  expect_contains(error_of("[distributed]\ndevices = [\"tpu:0\", \"cpu\"]\n").what(), "lists \"tpu:0\"");
  expect_contains(error_of("[distributed]\ndevices = [\"cuda\", \"cuda:1\"]\n").what(), "give it alone");
}

// Replicas sharing one GPU cannot synchronize BatchNorm inside backward: the config's check refuses sync_bn for an
// arch whose registry entry holds BatchNorm, before any data is read; without BatchNorm, or sync_bn, or on GPUs of
// their own, it is fine.
TEST(Config, SyncBnOnReplicasSharingOneGpuIsRefusedForABatchNormArch) {
  const std::string one_gpu = "[distributed]\ndevices = [\"cuda:0\", \"cuda:0\"]\n";
  const auto e = error_of("[model]\narch = \"resnet\"\n" + one_gpu);
  EXPECT_EQ(e.key(), "distributed.devices");
  expect_contains(e.what(), "model.arch = \"resnet\" holds BatchNorm layers");
  expect_contains(e.what(), "set distributed.sync_bn = false");
  EXPECT_NO_THROW(parse_config("[model]\narch = \"resnet\"\n" + one_gpu + "sync_bn = false\n", "run.toml"));
  EXPECT_NO_THROW(parse_config("[model]\narch = \"simple_cnn\"\n" + one_gpu, "run.toml"));
  EXPECT_NO_THROW(
      parse_config("[model]\narch = \"conv_net\"\n[distributed]\ndevices = [\"cuda:0\", \"cuda:1\"]\n", "run.toml"));
}

TEST(Config, AProgramsSamplesAreDescribedByTheirShapesAndPlannedAsSteps) {
  const std::string program =
      "[data]\ndataset = \"program\"\ninput_shape = [2, 16, 16]\ntarget_shape = [1, 16, 16]\nsteps_per_epoch = 50\n"
      "held_out = 32\nvalid_bs = 16\n";
  const auto c = parse_config(program + "[model]\narch = \"field_cnn\"\nhidden = []\n[train]\nepochs = 4\n", "p.toml");
  EXPECT_EQ(c.train.loss, "mse");  // a regression
  EXPECT_EQ(parse_config(program, "p.toml").model.arch, "mlp");
  const auto plan = fastlearn::step_plan(c);
  EXPECT_EQ(plan.steps, 200);
  EXPECT_EQ(plan.steps_per_epoch, 50);
  EXPECT_EQ(plan.held_out, 32);
  EXPECT_EQ(plan.valid_bs, 16);
  EXPECT_EQ(parse_config(to_toml(c), "resolved.toml"), c);
  // What does not fit is said by key.
  expect_contains(error_of("[data]\ndataset = \"program\"\ntarget_shape = [1]\n").what(),
                  "data.input_shape: dataset = \"program\" needs it");
  expect_contains(error_of(program + "[model]\narch = \"field_cnn\"\n", {"data.target_shape=[1, 8, 8]"}).what(),
                  "keeps a field's height and width");
  expect_contains(error_of(program + "[model]\narch = \"field_cnn\"\n", {"data.target_shape=[256]"}).what(),
                  "maps fields to fields");
  expect_contains(error_of(program + "[model]\narch = \"field_cnn\"\nkernel_size = 4\n").what(),
                  "model.kernel_size: must be odd");
  expect_contains(error_of(program + "[model]\nhidden = [2000000]\n").what(), "a layer is at most 1048576 wide");
  expect_contains(error_of(program, {"data.input_shape=[1, 1, 1, 1, 1, 1, 1]"}).what(), "at most 6");
  expect_contains(error_of(program, {"data.input_shape=[65536, 65536]"}).what(), "more than 2^31 values");
  expect_contains(error_of("[data]\ninput_shape = [4]\n").what(), "applies to dataset = \"program\" only");
  expect_contains(error_of("[model]\narch = \"field_cnn\"\n").what(), "model.arch");
  // Such a config trains only from a program's steps.
  EXPECT_THROW(fastlearn::step_plan(parse_config("", "fashion.toml")), fastlearn::ConfigError);
  auto learn = fastlearn::learner_from_config(c, {.run_callbacks = false, .progress = false});
  try {
    fastlearn::fit_from_config(*learn, c);
    ADD_FAILURE() << "fit_from_config trained a program's config";
  } catch (const fastlearn::ConfigError& e) {
    expect_contains(e.what(), "the samples come from a running program");
  }
}
