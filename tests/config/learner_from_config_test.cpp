// config/registry.h, config/learner_from_config.h and config/load_learner.h: every name a config may give builds its
// Learner and trains on tiny data of each kind a config reads, and its export loads without that data into a Learner
// that predicts new items exactly as the trained one; an unknown name is an error wherever it comes from; an app's own
// entries follow the same rules and are then usable from a config file.
#include <fastlearn/callbacks/graceful_stop.h>
#include <fastlearn/config/learner_from_config.h>
#include <fastlearn/config/load_learner.h>
#include <fastlearn/config/registry.h>
#include <fastlearn/core/error.h>
#include <fastlearn/core/safetensors.h>
#include <fastlearn/data/csv.h>
#include <fastlearn/data/image_dataloaders.h>
#include <fastlearn/data/image_decode.h>
#include <fastlearn/data/image_encode.h>
#include <fastlearn/data/tabular_dataloaders.h>
#include <fastlearn/learner/named_predictions.h>
#include <fastlearn/learner/predict_mask.h>
#include <fastlearn/learner/segmentation_loss.h>
#include <fastlearn/learner/segmentation_results.h>
#include <fastlearn/learner/tabular_learner.h>
#include <fastlearn/learner/vision_learner.h>
#include <fastlearn/models/models.h>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <torch/csrc/jit/api/module.h>
#include <torch/torch.h>

#include <cmath>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <numeric>
#include <optional>
#include <set>
#include <string>
#include <utility>
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
    fl::testing::write_ratings_csv(dir_ / "ratings.csv", fl::testing::ratings_table(120, 8, 10));
    // Segmentation: images with grey masks of classes 0 and 1 (two: dice and jaccard_coeff take them) (the class
    // follows the red channel, so a model can learn).
    for (int i = 0; i < 12; ++i) {
      const auto mask = torch::randint(0, 2, {1, 40, 36}, torch::kInt32).to(torch::kUInt8);
      auto image = torch::randint(0, 120, {3, 40, 36}, torch::kInt32);
      image[0] += mask[0].to(torch::kInt32) * 60;
      fs::create_directories(dir_ / "shapes" / "images");
      fs::create_directories(dir_ / "shapes" / "masks");
      write_bytes(dir_ / "shapes" / "images" / fmt::format("{}.png", i), fl::encode_png(image.to(torch::kUInt8)));
      write_bytes(dir_ / "shapes" / "masks" / fmt::format("{}.png", i), fl::encode_png(mask));
    }
  }
  void TearDown() override { fs::remove_all(dir_); }

  // A TorchScript model for each dataset, compiled here (TorchScript's own compiler, no Python): a weight and a bias
  // per output over the mean of each item's inputs, shaped as the dataset's targets; and a scripted cross entropy.
  fs::path script_for(const std::string& dataset) const {
    const auto file = dir_ / fmt::format("{}.pt", dataset);
    if (fs::exists(file)) return file;
    const std::map<std::string, std::pair<std::int64_t, std::string>> outputs_and_code{
        {"fashion_mnist",
         {10, "def forward(self, x):\n    return torch.flatten(x, 1).mean(1, True) * self.a + self.w\n"}},
        {"synthetic_regression", {1, "def forward(self, x):\n    return x.mean(1, True) * self.a + self.w\n"}},
        {"image_folder",
         {2, "def forward(self, x):\n    return torch.flatten(x, 1).mean(1, True) * self.a + self.w\n"}},
        {"image_csv", {2, "def forward(self, x):\n    return torch.flatten(x, 1).mean(1, True) * self.a + self.w\n"}},
        {"segmentation",
         {2,
          "def forward(self, x):\n    return x.mean(1, True) * self.a.view(1, 2, 1, 1) + self.w.view(1, 2, 1, 1)\n"}},
        {"csv",
         {2,
          "def forward(self, x_cat, x_cont):\n"
          "    return torch.cat([x_cat.float(), x_cont], 1).mean(1, True) * self.a + self.w\n"}},
        {"program", {1, "def forward(self, x):\n    return x * self.a + self.w\n"}},
        {"ratings", {1, "def forward(self, x):\n    return x.float().mean(1) * self.a + self.w\n"}},
        {"loss", {0, "def forward(self, pred, target):\n    return torch.cross_entropy_loss(pred, target)\n"}}};
    const auto& [outputs, code] = outputs_and_code.at(dataset);
    torch::jit::Module script("Tiny");
    if (outputs > 0) {
      script.register_parameter("a", torch::randn({outputs}).requires_grad_(), false);
      script.register_parameter("w", torch::zeros({outputs}).requires_grad_(), false);
    }
    script.define(code);
    script.save(file.string());
    return file;
  }

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
            {"segmentation", fmt::format("dataset = \"segmentation\"\npath = \"{}\"\nmasks = \"masks\"\n"
                                         "codes = [\"a\", \"b\"]\nsize = 32\nbs = 4\nworkers = 0\n",
                                         (dir_ / "shapes").string())},
            {"csv", fmt::format("dataset = \"csv\"\npath = \"{}\"\ny_names = [\"kind\"]\ncat_names = [\"colour\"]\n"
                                "cont_names = [\"size\"]\nbs = 8\nworkers = 0\n",
                                (dir_ / "table.csv").string())},
            {"ratings", fmt::format("dataset = \"ratings\"\npath = \"{}\"\nbs = 8\nworkers = 0\n",
                                    (dir_ / "ratings.csv").string())},
            {"program",
             "dataset = \"program\"\ninput_shape = [2, 6, 6]\ntarget_shape = [2, 6, 6]\nsteps_per_epoch = 3\n"
             "held_out = 4\n"}};
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
    if (key == "model.arch" && value == "torchscript")
      sets.push_back(fmt::format("model.file=\"{}\"", script_for(dataset).string()));
    if (key == "train.loss" && value == "torchscript")
      sets.push_back(fmt::format("train.loss_file=\"{}\"", script_for("loss").string()));
    if (dataset == "segmentation" && value != "torchscript")
      sets.push_back("model.body=\"resnet18\"");  // the smallest U-Net
    return fl::parse_config(text, dataset + ".toml", sets, fl::regression_of_data);
  }

  // The first dataset whose config takes `key = value` (the checks decide: the task, the arch's data, fine_tune's
  // body), or a failure naming what none took.
  fl::TrainConfig first_config_taking(const std::string& key, const std::string& value) const {
    std::string why;
    for (const char* dataset :
         {"fashion_mnist", "synthetic_regression", "image_folder", "image_csv", "csv", "segmentation"}) {
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
  // `batch_norm`: what the arch's registry entry says of the model (checked against the model built).
  static void expect_trains(const fl::TrainConfig& config, const std::string& what,
                            std::optional<bool> batch_norm = std::nullopt) {
    SCOPED_TRACE(what);
    auto learn = fl::learner_from_config(config, {.run_callbacks = false, .progress = false});
    if (batch_norm) {
      bool holds = false;
      for (const auto& m : learn->model().modules()) holds = holds || m->name().find("BatchNorm") != std::string::npos;
      EXPECT_EQ(holds, *batch_norm) << "the registry's holds_batch_norm disagrees with the model built";
    }
    const auto before = fl::testing::snapshot(learn->model());
    train_as_configured(*learn, config);
    EXPECT_FALSE(fl::testing::same_tensors(before, fl::testing::snapshot(learn->model())));
    auto program_valid = program_samples(config, 4);
    const auto result = learn->validate(program_valid ? &*program_valid : nullptr);
    EXPECT_TRUE(std::isfinite(result.loss)) << result.loss;
    for (const auto& [name, value] : result.metrics) EXPECT_TRUE(std::isfinite(value)) << name;
  }

  // `n` random samples (inputs, targets) of the shapes of a config with data.dataset = "program".
  static std::pair<at::Tensor, at::Tensor> random_samples(const fl::TrainConfig& config, std::int64_t n) {
    const auto batch = [&](const std::vector<std::int64_t>& sample) {
      std::vector<std::int64_t> shape{n};
      shape.insert(shape.end(), sample.begin(), sample.end());
      return torch::randn(shape);
    };
    return {batch(config.data.input_shape), batch(config.data.target_shape)};
  }

  // A loader of such samples for a program's config (none for another).
  static std::optional<fl::DataLoader> program_samples(const fl::TrainConfig& config, std::int64_t n) {
    if (config.data.dataset != "program") return std::nullopt;
    auto [x, y] = random_samples(config, n);
    return fl::DataLoader(std::make_shared<fl::TensorDataset>(std::vector<at::Tensor>{x}, std::vector<at::Tensor>{y}),
                          {.bs = n});
  }

  // fit_from_config, or for a program's samples the steps the config plans, on random batches (4 of them held out).
  static void train_as_configured(fl::Learner& learn, const fl::TrainConfig& config) {
    if (config.data.dataset != "program") return fl::fit_from_config(learn, config);
    learn.begin_steps(fl::step_plan(config), fl::step_fit(config));
    const auto [held_x, held_y] = random_samples(config, 4);
    learn.hold_out({held_x}, {held_y});
    while (learn.stepping()) {
      const auto [x, y] = random_samples(config, 4);
      learn.train_step(x, y);
    }
    learn.end_steps();
  }

  fs::path dir_;
};

TEST_F(TinyConfigs, EveryArchBuildsAndTrainsOnEachDatasetItReads) {
  int trained = 0;
  for (const auto& arch : fl::arch_choices()) {
    ASSERT_FALSE(arch.datasets.empty()) << arch.name;
    for (const auto& dataset : arch.datasets) {
      ASSERT_TRUE(data_tables().count(dataset)) << "no tiny " << dataset << " data for arch " << arch.name;
      const auto config = config_of(dataset, "model.arch", arch.name);
      expect_trains(config, arch.name + " on " + dataset, arch.holds_batch_norm && arch.holds_batch_norm(config));
      ++trained;
    }
  }
  // simple_cnn, mlp (three times), conv_net, resnet, resnet18/34/50 (twice each), tabular, field_cnn
  EXPECT_GE(trained, 14);
}

// fine_tune from a config freezes what vision_learner's does: the registry's pretrained archs carry the body/head
// splitter, so the frozen fit trains the head alone (the body's convolutions keep their weights; its BatchNorm trains,
// fastai's train_bn) and the unfrozen fit trains the body at the head's rate / 100 at every step (fastai's
// slice(base_lr / lr_mult, base_lr)).
TEST_F(TinyConfigs, FineTuneFromAConfigFreezesTheBodyOfAPretrainedArch) {
  struct Probe : fl::Callback {
    std::vector<at::Tensor> body_convs;  // the body's convolution weights at the start of the fit
    std::map<std::string, bool> body_trained;
    std::vector<double> body_over_head;  // the unfrozen fit's lr ratio at each step
    void before_fit() override {
      body_convs.clear();
      const auto groups = learn().param_groups();
      for (const auto& p : groups.front())
        if (p.dim() == 4) body_convs.push_back(p.detach().clone());
    }
    void after_fit() override {
      std::size_t i = 0;
      bool changed = false;
      const auto groups = learn().param_groups();
      for (const auto& p : groups.front())
        if (p.dim() == 4) changed = changed || !p.detach().equal(body_convs.at(i++));
      body_trained[learn().phase] = changed;
    }
    void before_step() override {
      if (learn().phase == "unfrozen")
        body_over_head.push_back(learn().opt().hyper("lr", 0) / learn().opt().hyper("lr", 1));
    }
  };
  auto config = config_of("image_folder", "model.arch", "resnet18");
  config.train.schedule = "fine_tune";
  config.train.epochs = 1;
  auto learn = fl::learner_from_config(config, {.run_callbacks = false, .progress = false});
  ASSERT_EQ(learn->param_groups().size(), 2U) << "resnet18 from the registry: the body and the head";
  auto probe = std::make_shared<Probe>();
  learn->add_cb(probe);
  fl::fit_from_config(*learn, config);
  EXPECT_FALSE(probe->body_trained.at("frozen")) << "the frozen fit changed the body's convolutions";
  EXPECT_TRUE(probe->body_trained.at("unfrozen"));
  ASSERT_FALSE(probe->body_over_head.empty());
  for (const double ratio : probe->body_over_head) EXPECT_NEAR(ratio, 0.01, 1e-12);
}

// The U-Net's entry carries unet_split: fine_tune's frozen fit leaves both groups of the body's convolutions as they
// were, and the unfrozen fit trains them, the stem's group at the decoder's rate / 100 (fastai's slice over 3 groups).
TEST_F(TinyConfigs, FineTuneFromAConfigFreezesTheBodyOfAUnet) {
  struct Probe : fl::Callback {
    std::vector<at::Tensor> body_convs;
    std::map<std::string, bool> body_trained;
    std::vector<double> stem_over_decoder;
    std::vector<at::Tensor> body() {
      std::vector<at::Tensor> convs;
      const auto groups = learn().param_groups();
      for (std::size_t g = 0; g < 2; ++g)
        for (const auto& p : groups[g])
          if (p.dim() == 4) convs.push_back(p.detach());
      return convs;
    }
    void before_fit() override {
      body_convs.clear();
      for (const auto& p : body()) body_convs.push_back(p.clone());
    }
    void after_fit() override {
      const auto now = body();
      bool changed = false;
      for (std::size_t i = 0; i < now.size(); ++i) changed = changed || !now[i].equal(body_convs.at(i));
      body_trained[learn().phase] = changed;
    }
    void before_step() override {
      if (learn().phase == "unfrozen")
        stem_over_decoder.push_back(learn().opt().hyper("lr", 0) / learn().opt().hyper("lr", 2));
    }
  };
  auto config = config_of("segmentation", "model.arch", "unet");
  config.train.schedule = "fine_tune";
  config.train.epochs = 1;
  auto learn = fl::learner_from_config(config, {.run_callbacks = false, .progress = false});
  ASSERT_EQ(learn->param_groups().size(), 3U) << "the U-Net from the registry: stem to layer2, layer3 and 4, decoder";
  auto probe = std::make_shared<Probe>();
  learn->add_cb(probe);
  fl::fit_from_config(*learn, config);
  EXPECT_FALSE(probe->body_trained.at("frozen")) << "the frozen fit changed the body's convolutions";
  EXPECT_TRUE(probe->body_trained.at("unfrozen"));
  ASSERT_FALSE(probe->stem_over_decoder.empty());
  for (const double ratio : probe->stem_over_decoder) EXPECT_NEAR(ratio, 0.01, 1e-12);
}

void own_handler(int) {}

// train.handle_signals = false: a program's own SIGTERM handler stays in place through the fit (no GracefulStop);
// by default the fit's handler replaces it while it trains, and the program's is back after.
TEST_F(TinyConfigs, HandleSignalsFalseLeavesTheProgramsOwnHandlerInPlace) {
  struct sigaction mine {
  }, before{};
  mine.sa_handler = own_handler;
  sigemptyset(&mine.sa_mask);
  ASSERT_EQ(sigaction(SIGTERM, &mine, &before), 0);
  struct Probe : fl::Callback {
    std::vector<bool> own;  // at each batch: whether SIGTERM's handler is the program's
    void before_batch() override {
      struct sigaction now {};
      sigaction(SIGTERM, nullptr, &now);
      own.push_back(now.sa_handler == own_handler);
    }
  };
  for (const bool handle : {true, false}) {
    SCOPED_TRACE(handle ? "handle_signals = true" : "handle_signals = false");
    auto config = config_of("synthetic_regression", "model.arch", "mlp");
    config.train.handle_signals = handle;
    config.output.checkpoints = false;
    auto learn = fl::learner_from_config(config, {.progress = false});
    EXPECT_EQ(learn->cb<fl::GracefulStop>() != nullptr, handle);
    auto probe = std::make_shared<Probe>();
    learn->add_cb(probe);
    fl::fit_from_config(*learn, config);
    ASSERT_FALSE(probe->own.empty());
    for (const bool own : probe->own) EXPECT_EQ(own, !handle);
    struct sigaction after {};
    sigaction(SIGTERM, nullptr, &after);
    EXPECT_EQ(after.sa_handler, own_handler) << "the program's handler is back after the fit";
  }
  sigaction(SIGTERM, &before, nullptr);
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
    for (const auto& part : {"config built in code: ", b.key.c_str(), b.name.c_str(), b.fitting.c_str()})
      EXPECT_NE(message.find(part), std::string::npos) << part << " not in: " << message;
  }
  // Checked as a value, not through TOML text: a key set where it does not apply is refused as a file naming it is
  // (to_toml would have left it out), a name that is not UTF-8 is refused by key, and a path that is not UTF-8 is
  // fine (its byte form holds it).
  const auto refused = [&](const std::function<void(fl::TrainConfig&)>& breaks) {
    auto config = base;
    breaks(config);
    return message_of([&] { fl::check_config(config); });
  };
  auto message = refused([](fl::TrainConfig& c) { c.model.weights = "resnet18.safetensors"; });
  EXPECT_NE(message.find("config built in code: model.weights: applies to arch = "), std::string::npos) << message;
  message = refused([](fl::TrainConfig& c) { c.data.synthetic.noise = 7; });
  EXPECT_EQ(message, "no error") << "it applies";
  message = refused([](fl::TrainConfig& c) { c.data.label_col = "caf\xe9"; });
  EXPECT_NE(message.find("config built in code: data.label_col: "), std::string::npos) << message;
  message = refused([](fl::TrainConfig& c) { c.train.metrics = {"rmse", "caf\xe9"}; });
  EXPECT_NE(message.find("train.metrics: 'caf\\xE9' is not valid UTF-8"), std::string::npos) << message;
  auto latin1 = base;
  latin1.output.dir = (dir_ / "caf\xe9").string();
  EXPECT_EQ(fl::check_config(latin1).output.dir, latin1.output.dir);
  // The finders say the same for the names they are asked about.
  auto config = base;
  config.train.loss = "hinge";
  EXPECT_THROW(fl::find_loss(config), fl::ConfigError);
  EXPECT_THROW(fl::find_metric("accuracy", base), fl::ConfigError);
  EXPECT_EQ(fl::find_metric("rmse", base).name, "rmse");
}

// Predictions of `learn` on new items of `dataset`'s kind, read from `dir` (written by write_new_items), as a program
// serving the model gets them: image files and a table's rows through test_dl, tensors through a loader of its own.
at::Tensor preds_on_new_items(fl::Learner& learn, const std::string& dataset, const fs::path& dir) {
  if (dataset == "csv" || dataset == "ratings") {
    const auto rows = dataset == "csv" ? "rows.csv" : "ratings.csv";
    auto dl = fl::TabularDataLoaders::test_dl(learn.dls(), fl::read_csv(dir / rows), rows);
    return learn.get_preds(&dl).preds;
  }
  if (dataset == "synthetic_regression" || dataset == "program") {
    const auto file = dir / (dataset == "program" ? "fields.safetensors" : "x.safetensors");
    fl::DataLoader dl(
        std::make_shared<fl::TensorDataset>(std::vector<at::Tensor>{fl::load_safetensors(file).tensors.at(0).second},
                                            std::vector<at::Tensor>{}),
        {.bs = 4});
    return learn.get_preds(&dl).preds;
  }
  std::vector<fs::path> files;
  for (int i = 0; i < 5; ++i) files.push_back(dir / fmt::format("{}.png", i));
  auto dl = fl::ImageDataLoaders::test_dl(learn.dls(), files);
  return learn.get_preds(&dl).preds;
}

// New items of every kind: RGB images of other sizes (the Fashion-MNIST models take them grey and squished), rows
// with a missing number, a category never seen and a missing one, and tensors.
void write_new_items(const fs::path& dir) {
  fs::create_directories(dir);
  for (int i = 0; i < 5; ++i) {
    const auto image = torch::randint(0, 256, {3, 30 + 7 * i, 50 - 3 * i}, torch::kInt32).to(torch::kUInt8);
    write_bytes(dir / fmt::format("{}.png", i), fl::encode_png(image));
  }
  write_bytes(dir / "rows.csv", "id,colour,size,kind\n1,red,1.5,big\n2,green,,small\n3,,7.25,\n4,blue,100,big\n");
  write_bytes(dir / "ratings.csv", "item,user\ni3,u1\ni1,u2\ni10,u8\n");
  fl::save_safetensors(dir / "x.safetensors", {{"x", torch::randn({6, 4})}});
  fl::save_safetensors(dir / "fields.safetensors", {{"x", torch::randn({6, 2, 6, 6})}});
}

// Every arch on each dataset it reads, a table's regression and a multi-label image task included: trained for an
// epoch, exported, the training data deleted, loaded; the loaded Learner predicts new items bit for bit as the trained
// one, and names its outputs the same way.
TEST_F(TinyConfigs, AnExportLoadsWithoutTheDataAndPredictsNewItemsExactlyAsTheTrainedLearner) {
  write_new_items(dir_ / "new");
  struct Exported {
    std::string what, dataset;
    fs::path file;
    at::Tensor preds;
    std::vector<std::string> names;
    bool values;
  };
  std::vector<Exported> exports;
  std::vector<std::pair<std::string, fl::TrainConfig>> configs;
  for (const auto& arch : fl::arch_choices())
    for (const auto& dataset : arch.datasets)
      configs.emplace_back(dataset, config_of(dataset, "model.arch", arch.name));
  configs.emplace_back("csv", fl::parse_config("[data]\n" + data_tables().at("csv"), "regression.toml",
                                               {"data.y_names=[\"size\"]", "data.cat_names=[\"colour\", \"kind\"]",
                                                "data.cont_names=[]", "train.epochs=1", "train.device=\"cpu\""},
                                               fl::regression_of_data));
  ASSERT_EQ(configs.back().second.data.y_block, "regression");
  for (const auto& [dataset, config] : configs) {
    const auto what = config.model.arch + " on " + dataset + " (" + config.data.y_block + ")";
    SCOPED_TRACE(what);
    auto learn = fl::learner_from_config(config, {.run_callbacks = false, .progress = false});
    train_as_configured(*learn, config);
    const auto file = learn->export_to(dir_ / "exports" / fmt::format("{}.safetensors", exports.size()));
    exports.push_back({what, dataset, file, preds_on_new_items(*learn, dataset, dir_ / "new"), fl::output_names(*learn),
                       fl::predicts_values(*learn)});
  }
  EXPECT_GE(exports.size(), 15u);
  for (const char* data : {"mnist", "folders", "tagged", "table.csv", "shapes", "ratings.csv"})
    fs::remove_all(dir_ / data);
  for (const auto& e : exports) {
    SCOPED_TRACE(e.what);
    auto loaded = fl::load_learner(e.file, {.device = torch::kCPU});
    const auto preds = preds_on_new_items(*loaded, e.dataset, dir_ / "new");
    ASSERT_EQ(preds.sizes(), e.preds.sizes());
    EXPECT_TRUE(torch::equal(preds, e.preds)) << (preds - e.preds).abs().max().item<double>();
    EXPECT_EQ(fl::output_names(*loaded), e.names);
    EXPECT_EQ(fl::predicts_values(*loaded), e.values);
  }
}

// predict_mask gives every pixel of an image of any size a class: the whole image resized at the items' scale, the
// probabilities resized back. An image of the item size with squish is the model's own output, unresized. Then
// show_results' picture and the top losses.
TEST_F(TinyConfigs, PredictMaskGivesEveryPixelOfTheImageAClass) {
  write_new_items(dir_ / "new");
  auto config = config_of("segmentation", "model.arch", "unet");
  config.data.transforms.resize = "squish";
  auto learn = fl::learner_from_config(config, {.run_callbacks = false, .progress = false});
  for (int i = 0; i < 5; ++i) {
    const auto file = dir_ / "new" / fmt::format("{}.png", i);
    const auto image = fl::read_image(file);
    const auto p = fl::predict_mask(*learn, file);
    EXPECT_EQ(p.mask.sizes(), image.sizes().slice(1)) << file;
    EXPECT_EQ(p.probs.sizes(), (std::vector<std::int64_t>{2, image.size(1), image.size(2)}));
    EXPECT_TRUE(p.probs.sum(0).allclose(torch::ones_like(p.mask, torch::kFloat), 1e-5, 1e-5));
    EXPECT_NEAR(std::accumulate(p.shares.begin(), p.shares.end(), 0.0), 1.0, 1e-9);
    const auto mask_alone = fl::predict_mask(*learn, file, {.probs = false});
    EXPECT_FALSE(mask_alone.probs.defined());
    EXPECT_TRUE(mask_alone.mask.equal(p.mask)) << "the mask made row by row is the mask of the probabilities";
  }
  // A strip of 1 x 600 pixels would be predicted at 32 x 19,200 (crop keeps the larger scale): refused, by its header.
  write_bytes(dir_ / "strip.png", fl::encode_png(torch::zeros({3, 1, 600}, torch::kUInt8)));
  auto cropping = fl::learner_from_config(config_of("segmentation", "model.arch", "unet"),
                                          {.run_callbacks = false, .progress = false});
  const auto strip = message_of([&] { fl::predict_mask(*cropping, dir_ / "strip.png"); });
  EXPECT_NE(strip.find("strip.png: an image of 1x600 pixels is predicted at the items' scale, 32x19200, above 4096"),
            std::string::npos)
      << strip;
  // Item size: the model's probabilities themselves.
  const auto item = dir_ / "new" / "item.png";
  write_bytes(item, fl::encode_png(torch::randint(0, 256, {3, 32, 32}, torch::kInt32).to(torch::kUInt8)));
  auto dl = fl::ImageDataLoaders::test_dl(learn->dls(), {item});
  const auto preds = learn->get_preds(&dl).preds[0];
  const auto p = fl::predict_mask(*learn, item);
  EXPECT_TRUE(p.probs.allclose(preds, 1e-6, 1e-6)) << (p.probs - preds).abs().max().item<double>();
  EXPECT_TRUE(p.mask.equal(preds.argmax(0)));
  // show_results: a row per item, the image, the true mask and the predicted one (class 0 black, class 1 coloured).
  learn->fit_one_cycle(1, 1e-3);
  fl::show_results(*learn, dir_ / "results.png", {.items = {1, 0}});
  const auto sheet = fl::read_image(dir_ / "results.png");
  ASSERT_EQ(sheet.sizes(), (std::vector<std::int64_t>{3, 2 * 32 + 2, 3 * 32 + 4}));
  const auto truth = learn->dls().valid().dataset().get(1).targets[0];
  const auto truth_panel = sheet.narrow(1, 0, 32).narrow(2, 34, 32).to(torch::kInt).sum(0);
  EXPECT_TRUE(truth_panel.eq(0).equal(truth.eq(0))) << "class 0 black, class 1 not";
  EXPECT_THROW(fl::show_results(*learn, dir_ / "bad.png", {.items = {99}}), fl::DataError);
  // The top losses: each the loss over the item alone, highest first.
  const auto worst = fl::segmentation_top_losses(*learn, 2);
  ASSERT_EQ(worst.size(), 2U);
  EXPECT_GE(worst[0].loss, worst[1].loss);
  auto one = fl::collate({learn->dls().valid().dataset().get(worst[0].index)});
  at::Generator generator = at::detail::createCPUGenerator(0);
  for (const auto& tfm : learn->dls().valid().options().batch_tfms) tfm(one, generator);
  const auto probs = learn->predict_batch({one.inputs[0]});
  EXPECT_NEAR(worst[0].loss, fl::pixel_cross_entropy()(probs.log(), one.targets[0]).template item<double>(), 1e-5);
  // The scale of each resize method: crop keeps the larger ratio, pad the smaller, squish each side's own.
  EXPECT_EQ(fl::prediction_size({100, 50}, {32, 32}, fl::ResizeMethod::crop), (fl::ImageSize{64, 32}));
  EXPECT_EQ(fl::prediction_size({100, 50}, {32, 32}, fl::ResizeMethod::pad), (fl::ImageSize{32, 16}));
  EXPECT_EQ(fl::prediction_size({100, 50}, {32, 48}, fl::ResizeMethod::squish), (fl::ImageSize{32, 48}));
}

// vision_learner and tabular_learner built in C++ record the config keys of their model, so their exports load
// without a factory, to the same predictions.
TEST_F(TinyConfigs, VisionAndTabularLearnersMadeInCodeExportTheirRecipe) {
  write_new_items(dir_ / "new");
  auto images = fl::vision_learner(fl::ImageDataLoaders::from_folder(dir_ / "folders", {.bs = 4, .size = 24}),
                                   {.arch = "resnet18"}, {.progress = false, .device = torch::kCPU});
  auto table = fl::tabular_learner(
      fl::TabularDataLoaders::from_csv(dir_ / "table.csv",
                                       {.y_names = {"kind"}, .cat_names = {"colour"}, .cont_names = {"size"}, .bs = 8}),
      {.layers = {8, 4}, .embed_p = 0.25}, {.progress = false, .device = torch::kCPU});
  for (auto* learn : {images.get(), table.get()}) {
    const bool is_table = learn == table.get();
    SCOPED_TRACE(is_table ? "tabular_learner" : "vision_learner");
    learn->fit(1, 1e-3);
    const auto dataset = is_table ? "csv" : "image_folder";
    const auto expected = preds_on_new_items(*learn, dataset, dir_ / "new");
    auto loaded = fl::load_learner(learn->export_to(dir_ / "export.safetensors"), {.device = torch::kCPU});
    EXPECT_TRUE(torch::equal(preds_on_new_items(*loaded, dataset, dir_ / "new"), expected));
  }
}

// What an export holds is checked when it is read: a checkpoint, a truncated or altered file, a format version from
// the future, a recipe this build cannot build and a model of one's own without its factory are errors that name the
// file and the problem; with the factory, the model of one's own loads.
TEST_F(TinyConfigs, ExportsThatCannotBeLoadedSayWhy) {
  const auto config = config_of("synthetic_regression", "model.arch", "mlp");
  auto learn = fl::learner_from_config(config, {.run_callbacks = false, .progress = false});
  const auto file = learn->export_to(dir_ / "export.safetensors");
  const auto bytes = [&] {
    std::ifstream in(file, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }();
  const auto error_of = [&](const std::string& name, const std::string& content, const fl::LoadLearnerOptions& o = {}) {
    write_bytes(dir_ / name, content);
    return message_of([&] { fl::load_learner(dir_ / name, o); });
  };
  EXPECT_NE(error_of("truncated.safetensors", bytes.substr(0, bytes.size() - 10)).find("truncated.safetensors"),
            std::string::npos);
  auto altered = bytes;
  altered[altered.size() - 3] ^= 0x40;  // a bit of the last tensor's data
  const auto crc = error_of("altered.safetensors", altered);
  EXPECT_NE(crc.find("altered.safetensors"), std::string::npos) << crc;
  EXPECT_NE(crc.find("does not match its checksum"), std::string::npos) << crc;

  auto latin1 = bytes;  // a name in the metadata that is not UTF-8: the file's header is refused as it is read
  latin1.replace(latin1.find("tensors"), 7, "tens\xffrs");
  const auto not_utf8 = error_of("latin1.safetensors", latin1);
  EXPECT_NE(not_utf8.find("latin1.safetensors"), std::string::npos) << not_utf8;
  EXPECT_EQ(not_utf8.find("no error"), std::string::npos) << not_utf8;

  const auto content = fl::load_safetensors(file);
  const auto with = [&](const std::string& key, const std::string& value) {
    auto m = content.metadata;
    m.erase(std::string(fl::kChecksumKey));
    m[key] = value;
    const auto name = fmt::format("{}.safetensors", key.empty() ? "plain" : key);
    fl::save_checked_safetensors(dir_ / name, content.tensors, m);
    return message_of([&] { fl::load_learner(dir_ / name); });
  };
  const auto future = with("format_version", "3");
  EXPECT_NE(future.find("export format version '3' is not one this build reads (1 to 2)"), std::string::npos) << future;
  EXPECT_EQ(with("format_version", "2"), "no error") << "version 2 need not carry a script (tensor inputs described)";
  const auto checkpoint = with("format", "fastlearn-checkpoint");
  EXPECT_NE(checkpoint.find("it is a checkpoint: `fastlearn export CONFIG --checkpoint FILE --out DIR`"),
            std::string::npos)
      << checkpoint;
  const auto pipeline =
      with("pipeline", R"({"kind":"tensors","c":1,"vocab":[],"multi_label":false,"item_shape":[4, -1]})");
  EXPECT_NE(pipeline.find("item_shape has a dimension -1 out of range"), std::string::npos) << pipeline;
  const auto huge =
      with("pipeline", R"({"kind":"tensors","c":1,"vocab":[],"multi_label":false,"item_shape":[65536, 65536, 65536]})");
  EXPECT_NE(huge.find("out of range"), std::string::npos) << huge;
  const auto vocab = with(
      "pipeline", "{\"kind\":\"tensors\",\"c\":1,\"vocab\":[\"\\u00ff\"],\"multi_label\":false,\"item_shape\":[4]}");
  EXPECT_EQ(vocab, "no error") << "a UTF-8 name loads";
  const auto arch =
      with("model_recipe", "[data]\ndataset = \"synthetic_regression\"\n[model]\narch = \"transformer\"\n");
  EXPECT_NE(arch.find("model_recipe:4:8: model.arch must be one of \"mlp\", \"torchscript\", not the string "
                      "\"transformer\""),
            std::string::npos)
      << arch;
  const auto wide = with("model_recipe",
                         "[data]\ndataset = \"synthetic_regression\"\n[model]\narch = \"mlp\"\n"
                         "hidden = [100000, 100000]\n");
  EXPECT_NE(wide.find("the model recipe gives model.hidden a size of 100000, and no tensor of the file has that size"),
            std::string::npos)
      << wide;
  const auto own = with("model_recipe", "");
  EXPECT_NE(own.find("give LoadLearnerOptions::model"), std::string::npos) << own;
  EXPECT_NE(with("threshold", "1.5").find("metadata 'threshold' is '1.5', not a number in (0, 1)"), std::string::npos);

  // A model of one's own: its factory builds it, and without it the error names that option.
  fl::save_checked_safetensors(dir_ / "own.safetensors", content.tensors, [&] {
    auto m = content.metadata;
    m.erase(std::string(fl::kChecksumKey));
    m["model_recipe"] = "";
    return m;
  }());
  const auto no_factory = message_of([&] { fl::load_learner(dir_ / "own.safetensors"); });
  EXPECT_NE(no_factory.find("give LoadLearnerOptions::model"), std::string::npos) << no_factory;
  auto loaded = fl::load_learner(dir_ / "own.safetensors",
                                 {.device = torch::kCPU, .model = [&](const fl::DataLoaders& dls) {
                                    return fl::BuiltModel::of(fl::models::mlp(4, config.model.hidden, dls.c()));
                                  }});
  const auto x = torch::randn({3, 4});
  torch::NoGradGuard no_grad;
  learn->model().eval();
  EXPECT_TRUE(torch::equal(loaded->forward({x}), learn->forward({x})));
  const auto wrong = message_of([&] {
    fl::load_learner(dir_ / "own.safetensors",
                     {.model = [](const fl::DataLoaders&) { return fl::BuiltModel::of(fl::models::mlp(4, {7}, 1)); }});
  });
  EXPECT_NE(wrong.find("own.safetensors"), std::string::npos) << wrong;
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
        // Its export loads with the app's loss, found by name among the registry's (past the scripted loss's entry,
        // whose file a recipe does not hold).
        const auto file = learn->export_to(fs::temp_directory_path() / fmt::format("fastlearn_huber_{}.st", getpid()));
        bool loads = false;
        try {
          const auto model = [](const fl::DataLoaders&) { return fl::BuiltModel::of(torch::nn::Linear(3, 1)); };
          loads = fl::load_learner(file, {.device = torch::kCPU, .model = model})->loss_func().name == "huber";
        } catch (const std::exception& e) {
          std::fprintf(stderr, "load_learner: %s\n", e.what());
        }
        fs::remove(file);
        // Refused for data the arch does not read, naming the names that fit there.
        const auto other = message_of([] {
          fl::parse_config(
              "[data]\ndataset = \"csv\"\npath = \"x.csv\"\ny_names = [\"y\"]\ncont_names = [\"x\"]\n"
              "[model]\narch = \"linear\"\n",
              "app.toml");
        });
        if (!usable || !loads || other.find("\"tabular\"") == std::string::npos) {
          std::fprintf(stderr, "linear %d usable %d loads %d refused: %s\n", linear, usable, loads, other.c_str());
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

// distributed.shard reaches the trainer the config's run attaches, and the buckets and the unused-parameter rule with
// it; with distributed.devices it is refused by name (replicas of one process are not sharded).
TEST(DistributedKeys, ShardReachesTheTrainerAndIsRefusedWithDevices) {
  const auto config = fl::parse_config(
      "[data]\ndataset = \"synthetic_regression\"\n[distributed]\nshard = \"gradients\"\nbucket_cap_mb = 4\n",
      "shard.toml", {}, fl::regression_of_data);
  const auto options = fl::trainer_options(config.distributed);
  EXPECT_EQ(options.shard, fl::Shard::gradients);
  EXPECT_EQ(options.reducer.bucket_cap_mb, 4.0);
  EXPECT_EQ(fl::trainer_options(fl::DistributedConfig{}).shard, fl::Shard::none);
  try {
    fl::parse_config(
        "[data]\ndataset = \"synthetic_regression\"\n[distributed]\nshard = \"optimizer\"\ndevices = [\"cpu\", "
        "\"cpu\"]\n",
        "shard.toml", {}, fl::regression_of_data);
    ADD_FAILURE() << "shard with devices was accepted";
  } catch (const fl::ConfigError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("distributed.shard"), std::string::npos) << what;
    EXPECT_NE(what.find("distributed.devices"), std::string::npos) << what;
  }
  // Stage 3 with its units; the units without it are refused by name.
  const auto units = fl::trainer_options(
      fl::parse_config("[data]\ndataset = \"synthetic_regression\"\n[distributed]\nshard = \"parameters\"\n"
                       "shard_units = [\"0.layer*.*\", \"1\"]\n",
                       "shard.toml", {}, fl::regression_of_data)
          .distributed);
  EXPECT_EQ(units.shard, fl::Shard::parameters);
  EXPECT_EQ(units.shard_units, (std::vector<std::string>{"0.layer*.*", "1"}));
  try {
    fl::parse_config("[data]\ndataset = \"synthetic_regression\"\n[distributed]\nshard_units = [\"1\"]\n", "shard.toml",
                     {}, fl::regression_of_data);
    ADD_FAILURE() << "shard_units without shard = parameters was accepted";
  } catch (const fl::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("distributed.shard = \"parameters\""), std::string::npos) << e.what();
  }
}
