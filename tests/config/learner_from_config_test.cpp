// config/registry.h and config/learner_from_config.h: every name a config may give builds its Learner and trains on
// tiny data of each kind a config reads; an unknown name is an error wherever it comes from; an app's own entries
// follow the same rules and are then usable from a config file.
#include <fastlearn/config/learner_from_config.h>
#include <fastlearn/config/registry.h>
#include <fastlearn/core/error.h>
#include <fastlearn/data/image_encode.h>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "support/build_paths.h"
#include "support/message_of.h"
#include "support/tiny_tasks.h"

namespace fs = std::filesystem;
namespace fl = fastlearn;
using fastlearn::testing::message_of;

namespace {

void write_bytes(const fs::path& file, const std::string& bytes) { std::ofstream(file, std::ios::binary) << bytes; }

std::string big_endian(std::uint32_t v) {
  return {static_cast<char>(v >> 24), static_cast<char>(v >> 16), static_cast<char>(v >> 8), static_cast<char>(v)};
}

// An MNIST-format pair: n random 28 x 28 images and labels 0..9.
void write_idx(const fs::path& dir, const std::string& prefix, std::uint32_t n) {
  std::string images = big_endian(0x803) + big_endian(n) + big_endian(28) + big_endian(28);
  std::string labels = big_endian(0x801) + big_endian(n);
  for (std::uint32_t i = 0; i < n * 28 * 28; ++i) images += static_cast<char>((i * 37 + n) % 251);
  for (std::uint32_t i = 0; i < n; ++i) labels += static_cast<char>(i % 10);
  write_bytes(dir / (prefix + "-images-idx3-ubyte"), images);
  write_bytes(dir / (prefix + "-labels-idx1-ubyte"), labels);
}

void write_png(const fs::path& file, int seed) {
  fs::create_directories(file.parent_path());
  const auto image = (torch::randint(0, 256, {3, 40, 40}, torch::kInt32) + 17 * seed).remainder(256).to(torch::kUInt8);
  write_bytes(file, fl::encode_png(image));
}

// Tiny data of every kind (about 20 items each) and the config text of each, for one test.
class TinyConfigs : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = (fs::temp_directory_path() / "fastlearn_registry_XXXXXX").string();
    ASSERT_NE(mkdtemp(pattern.data()), nullptr);
    dir_ = pattern;
    torch::manual_seed(0);
    fs::create_directories(dir_ / "mnist");
    write_idx(dir_ / "mnist", "train", 16);
    write_idx(dir_ / "mnist", "t10k", 8);
    for (const char* split : {"train", "valid"})
      for (const char* label : {"cat", "dog"})
        for (int i = 0; i < (split[0] == 't' ? 4 : 2); ++i)
          write_png(dir_ / "folders" / split / label / fmt::format("{}.png", i), i);
    std::string table = "file,labels,is_valid\n";
    for (int i = 0; i < 10; ++i) {
      write_png(dir_ / "tagged" / fmt::format("{}.png", i), i);
      table += fmt::format("{}.png,{},{}\n", i, i % 3 == 0 ? "cat dog" : (i % 2 ? "cat" : "dog"), i >= 8);
    }
    write_bytes(dir_ / "tagged" / "labels.csv", table);
    std::string rows = "size,colour,kind\n";
    for (int i = 0; i < 24; ++i)
      rows += fmt::format("{},{},{}\n", i * 0.5, i % 3 ? "red" : "blue", i % 2 ? "big" : "small");
    write_bytes(dir_ / "table.csv", rows);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // The [data] table of each dataset, with `[model]` / `[train]` to follow.
  std::map<std::string, std::string> data_tables() const {
    return {{"fashion_mnist", fmt::format("dataset = \"fashion_mnist\"\npath = \"{}\"\nbs = 8\nworkers = 0\n",
                                          (dir_ / "mnist").string())},
            {"synthetic_regression",
             "dataset = \"synthetic_regression\"\nbs = 8\nworkers = 0\n"
             "[data.synthetic]\nn_train = 16\nn_valid = 8\nfeatures = 4\n"},
            {"image_folder", fmt::format("dataset = \"image_folder\"\npath = \"{}\"\nsize = 32\nbs = 4\nworkers = 0\n",
                                         (dir_ / "folders").string())},
            {"image_csv", fmt::format("dataset = \"image_csv\"\npath = \"{}\"\nvalid_col = \"is_valid\"\n"
                                      "label_delim = \" \"\nsize = 32\nbs = 4\nworkers = 0\n",
                                      (dir_ / "tagged").string())},
            {"csv", fmt::format("dataset = \"csv\"\npath = \"{}\"\ny_names = [\"kind\"]\ncat_names = [\"colour\"]\n"
                                "cont_names = [\"size\"]\nbs = 8\nworkers = 0\n",
                                (dir_ / "table.csv").string())}};
  }

  // The config of `dataset` with `key = "value"` set (key "model.arch", "train.loss", ...): one epoch, no metric
  // but those set, on the CPU.
  fl::TrainConfig config_of(const std::string& dataset, const std::string& key, const std::string& value) const {
    std::string text = "[data]\n" + data_tables().at(dataset);
    const auto set = fmt::format("{}=\"{}\"", key, value);
    std::vector<std::string> sets{"train.epochs=1", "train.device=\"cpu\"", "train.metrics=[]",
                                  "output.dir=\"" + (dir_ / "out").string() + "\""};
    if (key == "train.metrics")
      sets.push_back(fmt::format("train.metrics=[\"{}\"]", value));
    else
      sets.push_back(set);
    if (value == "top_k_accuracy") sets.push_back("train.top_k=2");
    return fl::parse_config(text, dataset + ".toml", sets, fl::regression_of_data);
  }

  // The first dataset whose config takes `key = value` (the checks decide: the task, the arch's data, fine_tune's
  // body), or a failure naming what none took.
  fl::TrainConfig first_config_taking(const std::string& key, const std::string& value) const {
    std::string why;
    for (const char* dataset : {"fashion_mnist", "synthetic_regression", "image_folder", "image_csv", "csv"}) {
      try {
        return config_of(dataset, key, value);
      } catch (const fl::ConfigError& e) {
        why += fmt::format("\n  {}: {}", dataset, e.what());
      }
    }
    ADD_FAILURE() << "no tiny dataset takes " << key << " = \"" << value << "\":" << why;
    throw std::runtime_error("no config");
  }

  // Builds the config's Learner, trains it as train.schedule says, and checks that the weights moved and the
  // validation loss is a number.
  static void expect_trains(const fl::TrainConfig& config, const std::string& what) {
    SCOPED_TRACE(what);
    auto learn = fl::learner_from_config(config, {.run_callbacks = false, .progress = false});
    const auto before = fl::testing::snapshot(learn->model());
    fl::fit_from_config(*learn, config);
    EXPECT_FALSE(fl::testing::same_tensors(before, fl::testing::snapshot(learn->model())));
    const auto result = learn->validate();
    EXPECT_TRUE(std::isfinite(result.loss)) << result.loss;
    for (const auto& [name, value] : result.metrics) EXPECT_TRUE(std::isfinite(value)) << name;
  }

  fs::path dir_;
};

TEST_F(TinyConfigs, EveryArchBuildsAndTrainsOnEachDatasetItReads) {
  int trained = 0;
  for (const auto& arch : fl::arch_choices()) {
    ASSERT_FALSE(arch.datasets.empty()) << arch.name;
    for (const auto& dataset : arch.datasets) {
      ASSERT_TRUE(data_tables().count(dataset)) << "no tiny " << dataset << " data for arch " << arch.name;
      expect_trains(config_of(dataset, "model.arch", arch.name), arch.name + " on " + dataset);
      ++trained;
    }
  }
  EXPECT_GE(trained, 12);  // simple_cnn, mlp (twice), conv_net, resnet, resnet18/34/50 (twice each), tabular
}

TEST_F(TinyConfigs, EveryLossMetricOptimizerAndScheduleBuildsAndTrains) {
  std::vector<std::pair<std::string, std::string>> choices;
  for (const auto& e : fl::loss_choices()) choices.emplace_back("train.loss", e.name);
  for (const auto& e : fl::metric_choices()) choices.emplace_back("train.metrics", e.name);
  for (const auto& e : fl::optimizer_choices()) choices.emplace_back("train.optimizer", e.name);
  for (const auto& e : fl::schedule_choices()) choices.emplace_back("train.schedule", e.name);
  ASSERT_GE(choices.size(), 20U);
  for (const auto& [key, name] : choices) expect_trains(first_config_taking(key, name), key + " = " + name);
}

TEST_F(TinyConfigs, TheTasksLossesAndMetricsFitEachOther) {
  // Each task's default loss and metric are its own; a loss of another task is refused by name.
  EXPECT_EQ(config_of("fashion_mnist", "model.arch", "mlp").train.loss, "cross_entropy");
  EXPECT_EQ(config_of("image_csv", "model.arch", "resnet18").train.loss, "bce_with_logits");
  EXPECT_EQ(config_of("synthetic_regression", "model.arch", "mlp").train.loss, "mse");
  const auto refused = message_of([&] { config_of("fashion_mnist", "train.loss", "mse"); });
  EXPECT_NE(refused.find("train.loss"), std::string::npos) << refused;
  EXPECT_NE(refused.find("\"cross_entropy\""), std::string::npos) << refused;
  EXPECT_EQ(refused.find("\"l1\""), std::string::npos) << refused;
}

// A config built in code is checked as a file would be: an unknown name never falls back to a default.
TEST_F(TinyConfigs, AnUnknownNameInAConfigBuiltInCodeIsAnErrorNamingTheKey) {
  const auto base = config_of("synthetic_regression", "model.arch", "mlp");
  struct Broken {
    std::function<void(fl::TrainConfig&)> breaks;
    std::string key, name, fitting;
  };
  const std::vector<Broken> broken{
      {[](fl::TrainConfig& c) { c.train.loss = "hinge"; }, "train.loss", "hinge", "\"l1\""},
      {[](fl::TrainConfig& c) { c.train.optimizer = "lamb"; }, "train.optimizer", "lamb", "\"sgd\""},
      {[](fl::TrainConfig& c) { c.train.metrics = {"accuracy"}; }, "train.metrics", "accuracy", "\"mae\""},
      {[](fl::TrainConfig& c) { c.train.schedule = "cosine"; }, "train.schedule", "cosine", "\"flat_cos\""},
      {[](fl::TrainConfig& c) { c.model.arch = "resnet18"; }, "model.arch", "resnet18", "\"mlp\""},
      {[](fl::TrainConfig& c) { c.data.dataset = "imagenet"; }, "data.dataset", "imagenet", "\"csv\""}};
  for (const auto& b : broken) {
    auto config = base;
    b.breaks(config);
    const auto message = message_of([&] { fl::learner_from_config(config, {.run_callbacks = false}); });
    for (const auto& part : {"to_toml(config):", b.key.c_str(), b.name.c_str(), b.fitting.c_str()})
      EXPECT_NE(message.find(part), std::string::npos) << part << " not in: " << message;
  }
  // The finders say the same for the names they are asked about.
  auto config = base;
  config.train.loss = "hinge";
  EXPECT_THROW(fl::find_loss(config), fl::ConfigError);
  EXPECT_THROW(fl::find_metric("accuracy", base), fl::ConfigError);
  EXPECT_EQ(fl::find_metric("rmse", base).name, "rmse");
}

// An MNIST-format folder with no training image: refused by name, not by an index error of the model's factory.
TEST_F(TinyConfigs, AnEmptyTrainingSplitIsNamed) {
  write_idx(dir_ / "mnist", "train", 0);
  const auto message = message_of(
      [&] { fl::learner_from_config(config_of("fashion_mnist", "model.arch", "mlp"), {.run_callbacks = false}); });
  EXPECT_NE(message.find("train"), std::string::npos) << message;
  EXPECT_EQ(message.find("out of range"), std::string::npos) << message;
}

TEST(Registry, AddedEntriesFollowTheNameRules) {
  const auto no_model = [](const fl::TrainConfig&, const fl::DataLoaders&) -> fl::BuiltModel { return {}; };
  EXPECT_NE(message_of([&] {
              fl::add_choice(fl::ArchChoice{"Big-Net", {"csv"}, no_model});
            }).find("lowercase"),
            std::string::npos);
  EXPECT_NE(message_of([&] {
              fl::add_choice(fl::OptimizerChoice{"adam", [](const fl::TrainConfig&) { return fl::OptFunc(); }});
            }).find("is there already"),
            std::string::npos);
  EXPECT_NE(message_of([&] { fl::add_choice(fl::LossChoice{"hinge", {}, {}}); }).find("no factory"), std::string::npos);
  EXPECT_NE(message_of([&] {
              fl::add_choice(fl::ArchChoice{"net", {}, no_model});
            }).find("names no dataset"),
            std::string::npos);
  EXPECT_NE(message_of([&] {
              fl::add_choice(fl::ArchChoice{"net", {"imagenet"}, no_model});
            }).find("unknown dataset \"imagenet\""),
            std::string::npos);
  for (const auto& arch : fl::arch_choices()) EXPECT_NE(arch.name, "net");
}

// An app's own arch and loss, added before it reads its config file, are names that file may give. Run in a child
// process (a death test that exits 0), so that the other tests see fastlearn's entries only.
// NOLINTBEGIN(clang-analyzer-cplusplus.NewDeleteLeaks): std::function frees the model holder (config/registry.cpp).
TEST(Registry, AnAppsOwnArchAndLossAreUsableFromItsConfigFile) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        fl::add_choice(
            fl::ArchChoice{"linear", {"synthetic_regression"}, [](const fl::TrainConfig& c, const fl::DataLoaders&) {
                             return fl::BuiltModel::of(torch::nn::Linear(c.data.synthetic.features, 1));
                           }});
        fl::add_choice(fl::LossChoice{"huber", {fl::Task::regression}, [](const fl::TrainConfig&) {
                                        return fl::Loss{.name = "huber",
                                                        .fn = [](const at::Tensor& out, const at::Tensor& target) {
                                                          return torch::huber_loss(out.flatten(), target.flatten());
                                                        }};
                                      }});
        const auto config = fl::parse_config(
            "[data]\ndataset = \"synthetic_regression\"\nworkers = 0\nbs = 16\n[data.synthetic]\nn_train = 32\n"
            "n_valid = 16\nfeatures = 3\n[model]\narch = \"linear\"\n[train]\nloss = \"huber\"\nepochs = 1\n"
            "device = \"cpu\"\n",
            "app.toml");
        auto learn = fl::learner_from_config(config, {.run_callbacks = false, .progress = false});
        fl::fit_from_config(*learn, config);
        const bool linear = learn->model().parameters().size() == 2 && learn->model().parameters()[0].size(1) == 3;
        const bool usable = linear && std::isfinite(learn->validate().loss) && !fl::channels_last_on(config);
        // Refused for data the arch does not read, naming the names that fit there.
        const auto other = message_of([] {
          fl::parse_config(
              "[data]\ndataset = \"csv\"\npath = \"x.csv\"\ny_names = [\"y\"]\ncont_names = [\"x\"]\n"
              "[model]\narch = \"linear\"\n",
              "app.toml");
        });
        if (!usable || other.find("\"tabular\"") == std::string::npos) {
          std::fprintf(stderr, "linear %d usable %d refused: %s\n", linear, usable, other.c_str());
          std::exit(1);
        }
        std::exit(0);
      },
      ::testing::ExitedWithCode(0), "");
}
// NOLINTEND(clang-analyzer-cplusplus.NewDeleteLeaks)

// docs/cli.md's rows for model.arch, train.loss, train.metrics, train.optimizer and train.schedule name every
// entry of fastlearn's registry.
TEST(Registry, TheCliGuideNamesEveryChoice) {
  std::ifstream page(fs::path(FASTLEARN_SOURCE_DIR) / "docs" / "cli.md");
  ASSERT_TRUE(page) << "docs/cli.md";
  std::map<std::string, std::string> rows;  // "[model] arch" -> its row
  std::string table;
  for (std::string line; std::getline(page, line);) {
    if (line.starts_with("### [") && line.back() == ']') table = line.substr(4);
    if (line.starts_with("| `")) rows[table + " " + line.substr(3, line.find('`', 3) - 3)] = line;
  }
  const auto expect_named = [&](const std::string& row, const std::vector<std::string>& names) {
    ASSERT_TRUE(rows.count(row)) << "docs/cli.md has no row " << row;
    for (const auto& name : names)
      EXPECT_NE(rows[row].find("`\"" + name + "\"`"), std::string::npos) << row << " lacks \"" << name << "\"";
  };
  std::vector<std::string> archs, losses, metrics;
  for (const auto& e : fl::arch_choices()) archs.push_back(e.name);
  for (const auto& e : fl::loss_choices()) losses.push_back(e.name);
  for (const auto& e : fl::metric_choices()) metrics.push_back(e.name);
  expect_named("[model] arch", archs);
  expect_named("[train] loss", losses);
  expect_named("[train] metrics", metrics);
  expect_named("[train] optimizer", fl::optimizer_names());
  expect_named("[train] schedule", fl::schedule_names());
}

}  // namespace
