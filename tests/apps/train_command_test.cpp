// `fastlearn train / validate / lr-find CONFIG` as a user runs them: the run folder's contents, nothing
// written for an invalid config, --resume, and data parallel runs through --nproc-per-node. Small
// synthetic regression runs keep this fast.
#include <fastlearn/config/train_config.h>
#include <fastlearn/data/image_decode.h>
#include <fastlearn/data/npy.h>

#include <fcntl.h>
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <sys/file.h>
#include <torch/torch.h>
#include <unistd.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>

#include "support/build_paths.h"
#include "support/multiprocess.h"
#include "support/processes.h"
#include "support/tiny_tasks.h"

namespace fs = std::filesystem;

namespace {

using fastlearn::testing::run_cli;

std::string read(const fs::path& file) {
  std::ifstream in(file);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

const char* kRegression = R"(# a tiny regression run
[data]
dataset = "synthetic_regression"
bs = 32
workers = 0
[data.synthetic]
n_train = 256
n_valid = 64
features = 4
[model]
arch = "mlp"
hidden = [16]
[train]
epochs = 2
lr = 0.01
)";

// The [data] table of scripts/make-census-csv's table at `csv`: the salary class from four categories and four numbers.
std::string census_data(const fs::path& csv, int bs) {
  return fmt::format(R"([data]
dataset = "csv"
path = "{}"
y_names = ["salary"]
cat_names = ["workclass", "education", "occupation", "native_country", "sex"]
cont_names = ["age", "hours_per_week", "capital_gain", "education_num"]
bs = {}
workers = 0
)",
                     csv.string(), bs);
}

class TrainCommand : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = (fs::temp_directory_path() / "fastlearn_train_XXXXXX").string();
    ASSERT_NE(mkdtemp(pattern.data()), nullptr);
    dir_ = pattern;
    config_ = dir_ / "run.toml";
    std::ofstream(config_) << kRegression;
    out_ = dir_ / "out";
  }
  void TearDown() override { fs::remove_all(dir_); }

  // 4 classes of 10 training and 4 validation PNG images (scripts/make-image-folders) and a resnet18 config over
  // them, `train_keys` added to [train] and `tail` after it; returns why not when Python cannot make the images.
  std::string write_image_folder_config(const std::string& train_keys, const std::string& tail = "") {
    const auto [made, why] = fastlearn::testing::run_shell(
        fmt::format("'{}' '{}/scripts/make-image-folders' '{}' --train 10 --valid 4 --classes 4 2>&1", FASTLEARN_PYTHON,
                    FASTLEARN_SOURCE_DIR, (dir_ / "images").string()));
    if (made != 0) return "scripts/make-image-folders needs a Python with numpy and Pillow: " + why;
    std::ofstream(config_) << fmt::format(R"([data]
dataset = "image_folder"
path = "{}"
size = 32
bs = 8
workers = 2
[model]
arch = "resnet18"
[train]
{}epochs = 2
lr = 0.002
metrics = ["accuracy"]
{})",
                                          (dir_ / "images" / "png").string(), train_keys, tail);
    return "";
  }

  std::string train(const std::string& extra) {
    return "train " + config_.string() + " --out " + out_.string() + " " + extra;
  }

  fs::path dir_, config_, out_;
};

TEST_F(TrainCommand, WritesTheRunFolder) {
  const auto r = run_cli(train("--set train.epochs=2"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("final validation set: loss "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find(", rmse "), std::string::npos) << r.output;

  // The resolved config reads back as the config that ran, with the output folder filled in.
  auto expected = fastlearn::load_config(config_.string(), std::vector<std::string>{"train.epochs=2"});
  expected.output.dir = out_.string();
  EXPECT_EQ(fastlearn::load_config((out_ / "config.toml").string()), expected);

  const auto metrics = nlohmann::json::parse(read(out_ / "metrics.json"));
  ASSERT_EQ(metrics.size(), 2u) << metrics;
  for (int epoch = 0; epoch < 2; ++epoch) {
    const auto& record = metrics[epoch];
    EXPECT_EQ(record["epoch"], epoch);
    for (const char* key : {"train_loss", "valid_loss", "rmse", "seconds"}) {
      EXPECT_TRUE(record.contains(key) && record[key].is_number()) << key << " in " << record;
    }
  }
  EXPECT_LT(metrics[1]["valid_loss"].get<double>(), metrics[0]["valid_loss"].get<double>());
  const auto csv = read(out_ / "history.csv");
  EXPECT_EQ(csv.rfind("epoch,train_loss,valid_loss,rmse,time\n", 0), 0u) << csv;
  EXPECT_EQ(std::count(csv.begin(), csv.end(), '\n'), 3) << csv;
  for (const char* file : {"checkpoints/ckpt-e0001-b0000000.safetensors", "checkpoints/ckpt-e0002-b0000000.safetensors",
                           "checkpoints/model.safetensors", "loss.svg", "export.safetensors"}) {
    EXPECT_TRUE(fs::is_regular_file(out_ / file)) << file;
  }
  EXPECT_NE(read(out_ / "loss.svg").find("<svg"), std::string::npos);

  // validate prints the same metrics for the final weights.
  const auto v =
      run_cli("validate " + config_.string() + " --checkpoint " + (out_ / "checkpoints/model.safetensors").string());
  ASSERT_EQ(v.exit_code, 0) << v.output;
  const auto final_line = r.output.substr(r.output.find("final validation set: ") + 22);
  const auto validated = v.output.substr(v.output.find("validation set: ") + 16);
  EXPECT_EQ(validated.substr(0, validated.find('\n')), final_line.substr(0, final_line.find(';')));
}

TEST_F(TrainCommand, TrainsResnet18OnImageFoldersAndSavesTheClassNamesWithTheModel) {
  const auto skip = write_image_folder_config("");
  if (!skip.empty()) GTEST_SKIP() << skip;
  const auto r = run_cli(train(""));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto metrics = nlohmann::json::parse(read(out_ / "metrics.json"));
  ASSERT_EQ(metrics.size(), 2u) << metrics;
  EXPECT_TRUE(metrics[1]["accuracy"].is_number()) << metrics;
  // The checkpoint's metadata holds the sorted class names.
  const auto model = read(out_ / "checkpoints" / "model.safetensors");
  EXPECT_NE(model.find(R"(\"Dress\",\"Pullover\",\"T-shirt_top\",\"Trouser\")"), std::string::npos)
      << model.substr(0, 400);

  // predict: one line per file, the class a name of the vocabulary; a file that does not decode is named.
  const auto image = dir_ / "images" / "png" / "valid" / "Trouser" / "valid_0000.png";
  std::ofstream(dir_ / "broken.png") << "not a png";
  const auto p = run_cli(fmt::format("predict {} --checkpoint {} {} {}", config_.string(),
                                     (out_ / "checkpoints" / "model.safetensors").string(), image.string(),
                                     (dir_ / "broken.png").string()));
  EXPECT_EQ(p.exit_code, 1) << p.output;
  const auto line = p.output.substr(p.output.find(image.string() + "\t"));
  const auto predicted = line.substr(image.string().size() + 1, line.find(' ') - image.string().size() - 1);
  EXPECT_TRUE(predicted == "Dress" || predicted == "Pullover" || predicted == "T-shirt_top" || predicted == "Trouser")
      << p.output;
  EXPECT_NE(p.output.find("broken.png"), std::string::npos) << p.output;
  // A folder: every image under it, one line each (it was std::bad_alloc); an empty folder is named.
  const auto folder = dir_ / "images" / "png" / "valid" / "Trouser";
  std::filesystem::create_directories(dir_ / "empty");
  const auto f = run_cli(fmt::format("predict {} --checkpoint {} {} {}", config_.string(),
                                     (out_ / "checkpoints" / "model.safetensors").string(), folder.string(),
                                     (dir_ / "empty").string()));
  EXPECT_EQ(f.exit_code, 1) << f.output;
  std::size_t lines = 0;
  for (const auto& file : std::filesystem::directory_iterator(folder)) {
    lines += f.output.find(file.path().string() + "\t") != std::string::npos;
  }
  EXPECT_GT(lines, 0u) << f.output;
  EXPECT_EQ(lines, static_cast<std::size_t>(std::distance(std::filesystem::directory_iterator(folder), {})))
      << f.output;
  EXPECT_NE(f.output.find((dir_ / "empty").string() + ": a folder with no .jpg, .jpeg or .png file in it"),
            std::string::npos)
      << f.output;

  // The export the run wrote predicts the same lines from the export alone, the training images moved away, in
  // batches; --out writes predictions.csv with every class's probability.
  const auto copies = dir_ / "new";
  fs::create_directories(copies);
  for (const auto& file : fs::directory_iterator(folder)) fs::copy_file(file.path(), copies / file.path().filename());
  const auto old_form = run_cli(fmt::format("predict {} --checkpoint {} {}", config_.string(),
                                            (out_ / "checkpoints" / "model.safetensors").string(), copies.string()));
  ASSERT_EQ(old_form.exit_code, 0) << old_form.output;
  fs::rename(dir_ / "images", dir_ / "moved");
  const auto from_export = run_cli(fmt::format("predict {} {} --out {}", (out_ / "export.safetensors").string(),
                                               copies.string(), (dir_ / "predicted").string()));
  fs::rename(dir_ / "moved", dir_ / "images");
  ASSERT_EQ(from_export.exit_code, 0) << from_export.output;
  EXPECT_EQ(from_export.output.substr(0, from_export.output.find("wrote ")), old_form.output);
  const auto csv = read(dir_ / "predicted" / "predictions.csv");
  EXPECT_EQ(csv.rfind("input,prediction,Dress,Pullover,T-shirt_top,Trouser\n", 0), 0u) << csv;
  EXPECT_EQ(std::count(csv.begin(), csv.end(), '\n'), 1 + std::distance(fs::directory_iterator(copies), {})) << csv;

  // interpret: the confusion matrix over the 16 validation images, and the grid of the 5 worst.
  const auto i =
      run_cli(fmt::format("interpret {} --checkpoint {} --top 5 --out {}", config_.string(),
                          (out_ / "checkpoints" / "model.safetensors").string(), (dir_ / "interp").string()));
  ASSERT_EQ(i.exit_code, 0) << i.output;
  EXPECT_NE(i.output.find("most confused"), std::string::npos) << i.output;
  const auto cm = read(dir_ / "interp" / "confusion_matrix.csv");
  EXPECT_EQ(cm.rfind("actual,Dress,Pullover,T-shirt_top,Trouser\nDress,", 0), 0u) << cm;
  std::int64_t total = 0;
  std::istringstream rows(cm.substr(cm.find('\n') + 1));
  for (std::string row; std::getline(rows, row);) {
    std::istringstream cells(row.substr(row.find(',') + 1));
    for (std::string cell; std::getline(cells, cell, ',');) total += std::stoll(cell);
  }
  EXPECT_EQ(total, 16) << cm;
  const auto grid = read(dir_ / "interp" / "top_losses.svg");
  std::size_t images = 0;
  for (auto at = grid.find("<image"); at != std::string::npos; at = grid.find("<image", at + 1)) ++images;
  EXPECT_EQ(images, 5u);
  const auto bad = run_cli(fmt::format("interpret {} --checkpoint {} --top 0", config_.string(),
                                       (out_ / "checkpoints" / "model.safetensors").string()));
  EXPECT_NE(bad.exit_code, 0);
}

// configs/segmentation.toml on shapes from scripts/make-shapes: it trains a U-Net, and the run's export alone (the data
// moved away) writes a mask per image at the image's own size, a PNG of class indices, and masks.csv with the shares.
TEST_F(TrainCommand, TheSegmentationConfigTrainsAndItsExportWritesAMaskPerImage) {
  const auto shapes = dir_ / "shapes", other = dir_ / "wide";
  for (const auto& [folder, args] :
       {std::pair{shapes, "--count 24"}, std::pair{other, "--count 2 --height 40 --width 70 --seed 5"}}) {
    const auto [made, why] = fastlearn::testing::run_shell(fmt::format(
        "'{}' '{}/scripts/make-shapes' '{}' {} 2>&1", FASTLEARN_PYTHON, FASTLEARN_SOURCE_DIR, folder.string(), args));
    if (made != 0) GTEST_SKIP() << "scripts/make-shapes needs a Python with numpy and Pillow: " << why;
  }
  for (const char* n : {"000", "001"})  // names of their own: one mask per name
    fs::rename(other / "images" / fmt::format("shape_{}.png", n), other / "images" / fmt::format("wide_{}.png", n));
  const auto config = fs::path(FASTLEARN_SOURCE_DIR) / "configs" / "segmentation.toml";
  const auto r = run_cli(fmt::format("train {} --out {} --set 'data.path=\"{}\"' --set train.epochs=1 --set data.bs=8",
                                     config.string(), out_.string(), shapes.string()));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto metrics = nlohmann::json::parse(read(out_ / "metrics.json"));
  EXPECT_TRUE(metrics[0]["dice_multi"].is_number()) << metrics;
  EXPECT_TRUE(metrics[0]["foreground_acc"].is_number()) << metrics;

  // interpret: the worst validation images, listed and drawn with their masks.
  const auto i = run_cli(fmt::format("interpret {} --checkpoint {} --top 3 --out {} --set 'data.path=\"{}\"'",
                                     config.string(), (out_ / "checkpoints" / "model.safetensors").string(),
                                     (dir_ / "interp").string(), shapes.string()));
  ASSERT_EQ(i.exit_code, 0) << i.output;
  EXPECT_NE(i.output.find("top losses (validation item, counted from 0: image, loss):\n"), std::string::npos)
      << i.output;
  const auto results = fastlearn::read_image(dir_ / "interp" / "show_results.png");
  EXPECT_EQ(results.size(1), 3 * 64 + 2 * 2) << "three rows of 64 pixels";
  fs::rename(shapes, dir_ / "moved");
  const auto masks = dir_ / "masks";
  const auto p =
      run_cli(fmt::format("predict {} {} {} --out {}", (out_ / "export.safetensors").string(),
                          (dir_ / "moved" / "images").string(), (other / "images").string(), masks.string()));
  ASSERT_EQ(p.exit_code, 0) << p.output;
  const auto csv = read(masks / "masks.csv");
  EXPECT_EQ(csv.rfind("input,mask,background,circle,square\n", 0), 0u) << csv;
  EXPECT_EQ(std::count(csv.begin(), csv.end(), '\n'), 1 + 24 + 2) << csv;
  for (const auto& [image, side] :
       {std::pair{dir_ / "moved" / "images" / "shape_000.png", std::array<std::int64_t, 2>{64, 64}},
        std::pair{other / "images" / "wide_001.png", std::array<std::int64_t, 2>{40, 70}}}) {
    const auto mask = fastlearn::read_mask(masks / image.filename());
    EXPECT_EQ(mask.size(0), side[0]) << image;
    EXPECT_EQ(mask.size(1), side[1]) << image;
    EXPECT_LT(mask.max().item<std::int64_t>(), 3) << image;
    EXPECT_NE(p.output.find(image.string() + "\t" + (masks / image.filename()).string() +
                            fmt::format(" ({}x{}): background ", side[0], side[1])),
              std::string::npos)
        << p.output;
  }
  // Two images of one name would write one mask: the second is refused, naming both.
  const auto twice = run_cli(fmt::format("predict {} {} {} --out {}", (out_ / "export.safetensors").string(),
                                         (dir_ / "moved" / "images" / "shape_000.png").string(),
                                         (dir_ / "moved" / "images" / "shape_000.png").string(), masks.string()));
  EXPECT_EQ(twice.exit_code, 1);
  EXPECT_NE(twice.output.find("its mask would overwrite that of"), std::string::npos) << twice.output;
  const auto no_out =
      run_cli(fmt::format("predict {} {}", (out_ / "export.safetensors").string(), (other / "images").string()));
  EXPECT_NE(no_out.exit_code, 0);
  EXPECT_NE(no_out.output.find("give --out DIR"), std::string::npos) << no_out.output;
}

// A CSV table through `fastlearn train`: one process, then 2 ranks with the same global batch, reach the same
// accuracy (within 1 point); predict reads CSV rows through the procs saved with the model.
// data.delimiter: a semicolon-separated table whose values hold commas trains, and predict reads its rows the same way.
TEST_F(TrainCommand, ATableWithAnotherDelimiterTrainsAndPredicts) {
  std::ofstream table(dir_ / "semi.csv");
  table << "size;kind;label\n";
  for (int i = 0; i < 240; ++i)
    table << (i % 10) << ";" << (i % 3 == 0 ? "\"red, dark\"" : "blue") << ";" << (i % 10 < 5 ? "small" : "big")
          << "\n";
  table.close();
  std::ofstream(config_) << fmt::format(R"([data]
dataset = "csv"
path = "{}"
delimiter = ";"
y_names = ["label"]
cat_names = ["kind"]
cont_names = ["size"]
bs = 32
workers = 0
[model]
arch = "tabular"
layers = [16]
[train]
epochs = 3
lr = 1e-2
)",
                                        (dir_ / "semi.csv").string());
  const auto trained = run_cli(train(""));
  ASSERT_EQ(trained.exit_code, 0) << trained.output;
  EXPECT_NE(read(out_ / "config.toml").find("delimiter = \";\""), std::string::npos);
  // Columns the model does not read (an id, the target) may be in predict's file.
  std::ofstream(dir_ / "rows.csv") << "id;kind;size;label\n1;\"red, dark\";1;small\n2;blue;9;\n3;blue;abc;big\n";
  const auto p =
      run_cli(fmt::format("predict {} --checkpoint {} {}", config_.string(),
                          (out_ / "checkpoints" / "model.safetensors").string(), (dir_ / "rows.csv").string()));
  ASSERT_EQ(p.exit_code, 1) << "the last row's size is not a number\n" << p.output;
  EXPECT_NE(p.output.find("rows.csv:2\tsmall"), std::string::npos) << p.output;
  EXPECT_NE(p.output.find("rows.csv:3\tbig"), std::string::npos) << p.output;
  // One place for a bad cell: the file's row, then the column (no second row number from the row's own table).
  EXPECT_NE(p.output.find("rows.csv:4: column 'size': 'abc' is not a number (a continuous column)\n"),
            std::string::npos)
      << p.output;
  EXPECT_EQ(p.output.find("row 2"), std::string::npos) << p.output;
}

// A numeric target and no data.y_block: a regression, as the C++ API (and fastai) decides from the data, with the
// regression loss and metrics (given or by default), and the resolved config says so.
TEST_F(TrainCommand, ANumericTargetWithoutYBlockIsARegression) {
  std::ofstream table(dir_ / "ages.csv");
  table << "kind,size,age\n";
  for (int i = 0; i < 200; ++i) table << (i % 3 == 0 ? "a" : "b") << "," << (i % 10) << "," << 20 + (i % 37) << ".5\n";
  table.close();
  std::ofstream(config_) << fmt::format(R"([data]
dataset = "csv"
path = "{}"
y_names = ["age"]
cat_names = ["kind"]
cont_names = ["size"]
bs = 32
workers = 0
[model]
arch = "tabular"
layers = [8]
[train]
epochs = 1
)",
                                        (dir_ / "ages.csv").string());
  const auto trained = run_cli(train("--set 'train.metrics=[\"rmse\", \"mae\"]'"));
  ASSERT_EQ(trained.exit_code, 0) << trained.output;
  const auto resolved = read(out_ / "config.toml");
  EXPECT_NE(resolved.find("y_block = \"regression\""), std::string::npos) << resolved;
  EXPECT_NE(resolved.find("loss = \"mse\""), std::string::npos) << resolved;
  const auto record = nlohmann::json::parse(read(out_ / "metrics.json")).back();
  EXPECT_TRUE(record.contains("rmse") && record.contains("mae")) << record.dump();
  // A metric of the other task says why the task is what it is.
  const auto accuracy = run_cli(train("--set 'train.metrics=[\"accuracy\"]'"));
  EXPECT_NE(accuracy.exit_code, 0);
  EXPECT_NE(accuracy.output.find("(\"accuracy\" needs data.y_block = \"category\")"), std::string::npos)
      << accuracy.output;
  EXPECT_NE(accuracy.output.find("the training values of the target 'age' are all numbers, so it is a regression"),
            std::string::npos)
      << accuracy.output;
}

// A table of ratings through `fastlearn train` (collaborative filtering): the dot-product model learns the planted
// ratings on one process and on 2 ranks; the export predicts a ratings file with the training data deleted, a row of
// a user the model never saw getting its own message while the others are predicted.
TEST_F(TrainCommand, RatingsTrainOnOneAndTwoRanksAndTheirExportPredictsUnknownIdsByRow) {
  fastlearn::testing::write_ratings_csv(dir_ / "ratings.csv", fastlearn::testing::ratings_table());
  std::ofstream(config_) << fmt::format(R"([data]
dataset = "ratings"
path = "{}"
bs = 32
workers = 0
[model]
arch = "collab"
n_factors = 8
y_range = [0, 6]
[train]
epochs = 6
lr = 3e-2
wd = 0.01
)",
                                        (dir_ / "ratings.csv").string());
  for (const char* ranks : {"", "--nproc-per-node 2 --set data.bs=16"}) {
    const auto trained = run_cli(train(ranks));
    ASSERT_EQ(trained.exit_code, 0) << trained.output;
    const auto last = nlohmann::json::parse(read(out_ / "metrics.json")).back();
    EXPECT_LT(last["valid_loss"].get<double>(), 2.0) << ranks << " " << last.dump();  // before: 3.4
  }
  EXPECT_NE(read(out_ / "config.toml").find("y_range = [0.0, 6.0]"), std::string::npos);
  // interpret: the items most and least liked whatever the user, and their factors' picture.
  const auto interp = run_cli(fmt::format("interpret {} --checkpoint {} --top 3 --out {}", config_.string(),
                                          (out_ / "checkpoints" / "model.safetensors").string(), out_.string()));
  ASSERT_EQ(interp.exit_code, 0) << interp.output;
  EXPECT_NE(interp.output.find("most liked whatever the user, among the 40 items rated most (item: bias):\n  i"),
            std::string::npos)
      << interp.output;
  EXPECT_NE(interp.output.find("least liked"), std::string::npos) << interp.output;
  EXPECT_NE(read(out_ / "item_factors.svg").find("</svg>"), std::string::npos);
  fs::remove(dir_ / "ratings.csv");
  // Every row known: predicted in batches (one value per row from the dot-product model).
  std::ofstream(dir_ / "known.csv") << "item,user\ni3,u1\ni1,u2\n";
  const auto known = run_cli(fmt::format("predict {} {} --out {}", (out_ / "export.safetensors").string(),
                                         (dir_ / "known.csv").string(), (dir_ / "predicted").string()));
  ASSERT_EQ(known.exit_code, 0) << known.output;
  EXPECT_NE(known.output.find("known.csv:3\trating "), std::string::npos) << known.output;
  EXPECT_NE(read(dir_ / "predicted" / "predictions.csv").find("input,prediction,rating\n"), std::string::npos);
  std::ofstream(dir_ / "new.csv") << "item,user,rating\ni3,u1,\ni7,u999,\ni1,u2,4\n";
  const auto p =
      run_cli(fmt::format("predict {} {}", (out_ / "export.safetensors").string(), (dir_ / "new.csv").string()));
  ASSERT_EQ(p.exit_code, 1) << "one row's user is unknown\n" << p.output;
  EXPECT_NE(p.output.find("new.csv:2\trating "), std::string::npos) << p.output;
  EXPECT_NE(p.output.find("new.csv:4\trating "), std::string::npos) << p.output;
  EXPECT_NE(p.output.find("new.csv:3: column 'user': 'u999' is not among the 30 values of the training rows"),
            std::string::npos)
      << p.output;
}

TEST_F(TrainCommand, TrainsATableOnOneAndTwoRanksAndPredictsCsvRows) {
  const auto census = dir_ / "census.csv";
  const auto [made, why] =
      fastlearn::testing::run_shell(fmt::format("'{}' '{}/scripts/make-census-csv' '{}' --rows 8000 2>&1",
                                                FASTLEARN_PYTHON, FASTLEARN_SOURCE_DIR, census.string()));
  if (made != 0) GTEST_SKIP() << "scripts/make-census-csv needs a Python with numpy: " << why;
  std::ofstream(config_) << census_data(census, 128) << R"([model]
arch = "tabular"
[train]
epochs = 4
lr = 1e-2
seed = 3
)";
  // top_k_accuracy's k against the data's 2 classes: refused with the data loaded, before the folder is written
  // (it used to fail after the first epoch), and train.top_k sets k.
  const auto top5 = run_cli(train("--set 'train.metrics=[\"top_k_accuracy\"]'"));
  EXPECT_NE(top5.exit_code, 0);
  EXPECT_NE(top5.output.find("top_k_accuracy with train.top_k = 5 needs at least 5 classes; the data has 2: set "
                             "train.top_k to at most 2"),
            std::string::npos)
      << top5.output;
  EXPECT_FALSE(fs::exists(out_));
  const auto top1 =
      run_cli(train("--set 'train.metrics=[\"top_k_accuracy\"]' --set train.top_k=1 --set train.epochs=1"));
  ASSERT_EQ(top1.exit_code, 0) << top1.output;
  EXPECT_TRUE(nlohmann::json::parse(read(out_ / "metrics.json")).back()["top_k_accuracy"].is_number());
  const auto one = run_cli(train(""));
  ASSERT_EQ(one.exit_code, 0) << one.output;
  const double alone = nlohmann::json::parse(read(out_ / "metrics.json")).back()["accuracy"];
  EXPECT_GT(alone, 0.8) << "the constant guess gets about 0.77";
  const auto model = out_ / "two" / "checkpoints" / "model.safetensors";
  const auto two = run_cli("train " + config_.string() + " --out " + (out_ / "two").string() +
                           " --nproc-per-node 2 --set data.bs=64");
  ASSERT_EQ(two.exit_code, 0) << two.output;
  const double ranks = nlohmann::json::parse(read(out_ / "two" / "metrics.json")).back()["accuracy"];
  EXPECT_GE(ranks, alone - 0.01) << "2 ranks of 64 reach 1 process of 128 (within 1 point): " << ranks << " vs "
                                 << alone;
  EXPECT_NE(read(model).find("tabular_procs"), std::string::npos) << "the procs are saved with the model";

  std::ofstream(dir_ / "rows.csv") << "age,workclass,education,occupation,native_country,sex,hours_per_week,"
                                      "capital_gain,education_num\n"
                                      "52,Private,Doctorate,Exec-managerial,United-States,Male,60,15000,16\n"
                                      ",,,,Atlantis,,,,\n"
                                      "old,Private,HS-grad,Sales,Mexico,Female,40,0,9\n";
  const auto p = run_cli(
      fmt::format("predict {} --checkpoint {} {}", config_.string(), model.string(), (dir_ / "rows.csv").string()));
  EXPECT_EQ(p.exit_code, 1) << "the third row's age is not a number:\n" << p.output;
  EXPECT_NE(p.output.find("rows.csv:2\t>=50k 0."), std::string::npos) << p.output;
  EXPECT_NE(p.output.find("rows.csv:3\t"), std::string::npos) << "missing and unknown cells still predict\n"
                                                              << p.output;
  EXPECT_NE(p.output.find("rows.csv:4: "), std::string::npos) << p.output;
  EXPECT_NE(p.output.find("column 'age': 'old' is not a number"), std::string::npos) << p.output;
  // A file without a column the model reads predicts nothing and names it.
  std::ofstream(dir_ / "no_age.csv") << "workclass,education,occupation,native_country,sex,hours_per_week,"
                                        "capital_gain,education_num\n"
                                        "Private,Doctorate,Exec-managerial,United-States,Male,60,15000,16\n";
  const auto no_age = run_cli(
      fmt::format("predict {} --checkpoint {} {}", config_.string(), model.string(), (dir_ / "no_age.csv").string()));
  EXPECT_EQ(no_age.exit_code, 1) << no_age.output;
  EXPECT_NE(no_age.output.find("no_age.csv: no column age that the model reads"), std::string::npos) << no_age.output;
  EXPECT_EQ(no_age.output.find("no_age.csv:2\t"), std::string::npos) << no_age.output;

  // The 2-rank run's export, in one process and without the table: the same lines, the same row refused.
  fs::rename(census, dir_ / "moved.csv");
  const auto e = run_cli(
      fmt::format("predict {} {}", (out_ / "two" / "export.safetensors").string(), (dir_ / "rows.csv").string()));
  fs::rename(dir_ / "moved.csv", census);
  EXPECT_EQ(e.exit_code, 1) << e.output;
  for (const char* row : {"rows.csv:2\t", "rows.csv:3\t"}) {
    const auto line = [&](const std::string& out) {
      const auto at = out.find(row);
      return at == std::string::npos ? std::string("none") : out.substr(at, out.find('\n', at) - at);
    };
    EXPECT_EQ(line(e.output), line(p.output)) << e.output;
  }
  EXPECT_NE(e.output.find("column 'age': 'old' is not a number"), std::string::npos) << e.output;

  const auto i = run_cli(fmt::format("interpret {} --checkpoint {} --out {}", config_.string(), model.string(),
                                     (dir_ / "interp").string()));
  ASSERT_EQ(i.exit_code, 0) << i.output;
  EXPECT_NE(i.output.find("top losses (validation row, counted from 0: actual, predicted (its probability), loss):\n"),
            std::string::npos)
      << i.output;
  // The columns are headed by the class names, and no row carries an index of its own.
  EXPECT_NE(i.output.find("(rows: actual, columns: predicted)\n         <50k  >=50k\n"), std::string::npos) << i.output;
  EXPECT_EQ(i.output.find("  (0)\n"), std::string::npos) << i.output;
  EXPECT_EQ(read(dir_ / "interp" / "confusion_matrix.csv").rfind("actual,<50k,>=50k\n", 0), 0u);
}

// Scripts a table model (categories and continuous columns in), an image model and a cross-entropy loss into `dir`.
const char* kMakeScripts = R"(import sys
import torch
from torch import nn

class Table(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(64, 4)
        self.norm = nn.BatchNorm1d(4)
        self.head = nn.Linear(4 + 4, 2)
    def forward(self, x_cat: torch.Tensor, x_cont: torch.Tensor) -> torch.Tensor:
        return self.head(torch.cat([self.emb(x_cat.clamp(0, 63)).sum(1), self.norm(x_cont)], 1))

class Images(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, stride=2)
        self.head = nn.Linear(8, 4)
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.conv(x)).mean((2, 3)))

class CrossEntropy(nn.Module):
    def forward(self, pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return nn.functional.cross_entropy(pred, target)

torch.manual_seed(0)
torch.jit.script(Table()).save(sys.argv[1] + "/table.pt")
torch.jit.script(Images()).save(sys.argv[1] + "/images.pt")
torch.jit.script(CrossEntropy()).save(sys.argv[1] + "/cross_entropy.pt")
)";

TEST_F(TrainCommand, ScriptedModelsAndLossesTrainFromTheConfigAndTheirExportPredictsWithoutThem) {
  const auto census = dir_ / "census.csv";
  std::ofstream(dir_ / "make_scripts.py") << kMakeScripts;
  const auto [made, why] = fastlearn::testing::run_shell(
      fmt::format("'{0}' -W ignore '{1}/make_scripts.py' '{1}' && '{0}' '{2}/scripts/make-census-csv' '{3}' --rows "
                  "2000 2>&1",
                  FASTLEARN_PYTHON, dir_.string(), FASTLEARN_SOURCE_DIR, census.string()));
  ASSERT_EQ(made, 0) << why;
  std::ofstream(config_) << census_data(census, 64)
                         << fmt::format(R"([model]
arch = "torchscript"
file = "{}"
[train]
epochs = 2
lr = 1e-2
loss = "torchscript"
loss_file = "{}"
activation = "softmax"
)",
                                        (dir_ / "table.pt").string(), (dir_ / "cross_entropy.pt").string());
  const auto one = run_cli(train(""));
  ASSERT_EQ(one.exit_code, 0) << one.output;
  const auto epochs = nlohmann::json::parse(read(out_ / "metrics.json"));
  EXPECT_LT(epochs.back()["valid_loss"].get<double>(), epochs.front()["valid_loss"].get<double>());
  // Its BatchNorm cannot become a SyncBatchNorm: named, and trained with each rank's statistics when asked.
  const auto two_ranks = "train " + config_.string() + " --out " + (out_ / "two").string() + " --nproc-per-node 2";
  const auto synced = run_cli(two_ranks);
  EXPECT_NE(synced.exit_code, 0);
  EXPECT_NE(synced.output.find("sync_bn: 'norm' of the TorchScript model does batch normalization"), std::string::npos)
      << synced.output;
  const auto two = run_cli(two_ranks + " --set distributed.sync_bn=false");
  ASSERT_EQ(two.exit_code, 0) << two.output;

  std::ofstream(dir_ / "rows.csv") << "age,workclass,education,occupation,native_country,sex,hours_per_week,"
                                      "capital_gain,education_num\n"
                                      "52,Private,Doctorate,Exec-managerial,United-States,Male,60,15000,16\n"
                                      "23,Private,HS-grad,Sales,Mexico,Female,40,0,9\n";
  const auto by_checkpoint =
      run_cli(fmt::format("predict {} --checkpoint {} {}", config_.string(),
                          (out_ / "checkpoints" / "model.safetensors").string(), (dir_ / "rows.csv").string()));
  ASSERT_EQ(by_checkpoint.exit_code, 0) << by_checkpoint.output;
  // The export carries the script: predicted the same in a fresh process with neither script nor table there.
  for (const char* gone : {"table.pt", "cross_entropy.pt", "census.csv"}) fs::rename(dir_ / gone, dir_ / "gone");
  const auto by_export =
      run_cli(fmt::format("predict {} {}", (out_ / "export.safetensors").string(), (dir_ / "rows.csv").string()));
  ASSERT_EQ(by_export.exit_code, 0) << by_export.output;
  for (const char* row : {"rows.csv:2\t", "rows.csv:3\t"}) {
    const auto line = [&](const std::string& out) {
      const auto at = out.find(row);
      return at == std::string::npos ? std::string("none") : out.substr(at, out.find('\n', at) - at);
    };
    EXPECT_NE(line(by_export.output), "none") << by_export.output;
    EXPECT_EQ(line(by_export.output), line(by_checkpoint.output));
  }

  // An image folder with a scripted model and the built-in loss.
  const auto no_images = write_image_folder_config("");
  if (!no_images.empty()) GTEST_SKIP() << no_images;
  const auto images = run_cli(train(
      fmt::format("--set model.arch='\"torchscript\"' --set model.file='\"{}\"'", (dir_ / "images.pt").string())));
  ASSERT_EQ(images.exit_code, 0) << images.output;
  EXPECT_TRUE(nlohmann::json::parse(read(out_ / "metrics.json")).back()["accuracy"].is_number());
  // Named when missing.
  const auto missing = run_cli(train("--set model.arch='\"torchscript\"'"));
  EXPECT_NE(missing.exit_code, 0);
  EXPECT_NE(missing.output.find("model.file: must name the TorchScript file of the model"), std::string::npos)
      << missing.output;
}

TEST_F(TrainCommand, ALaunchFlagThatASetRankOverridesIsNamed) {
  // RANK left in the shell makes this process one rank of someone else's job: --nproc-per-node cannot apply, and
  // says so instead of going quiet.
  const auto r = fastlearn::testing::run_shell(std::string("RANK=0 WORLD_SIZE=1 ") + FASTLEARN_CLI + " " +
                                               train("--nproc-per-node 2 --set train.epochs=1"));
  EXPECT_EQ(r.first, 0) << r.second;
  EXPECT_NE(r.second.find("RANK is set (0), so this process is one rank of a job someone else launched: "
                          "--nproc-per-node and --max-restarts are ignored"),
            std::string::npos)
      << r.second;
  EXPECT_EQ(r.second.find("[rank 1]"), std::string::npos) << "no rank was started";
}

// A folder name is bytes, as for every command-line tool: a run in one that is not UTF-8 (Latin-1 here) trains, and
// its config.toml holds the folder in fastlearn's byte form, so that validate, --resume and predict read it back to
// the same bytes; a --set path in such a folder works too.
TEST_F(TrainCommand, ARunInAFolderWhoseNameIsNotUtf8TrainsValidatesResumesAndPredicts) {
  const auto latin1 = dir_ / "caf\xe9";
  out_ = latin1 / "run";
  const auto r = run_cli(train("--set train.epochs=2"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(fs::exists(out_ / "checkpoints" / "model.safetensors"));
  const auto resolved = read(out_ / "config.toml");
  EXPECT_NE(resolved.find("dir = \"\\u0000" + (dir_ / "caf%E9" / "run").string() + "\""), std::string::npos)
      << resolved;
  EXPECT_EQ(fastlearn::load_config((out_ / "config.toml").string()).output.dir, out_.string());
  const auto v = run_cli("validate " + (out_ / "config.toml").string() + " --checkpoint " +
                         (out_ / "checkpoints" / "model.safetensors").string());
  EXPECT_EQ(v.exit_code, 0) << v.output;
  const auto by_set = run_cli("validate " + config_.string() + " --set 'output.dir=\"" + out_.string() +
                              "\"' --checkpoint " + (out_ / "checkpoints" / "model.safetensors").string());
  EXPECT_EQ(by_set.exit_code, 0) << by_set.output;
  // The run goes on from its own config.toml, in the same folder, and its log keeps the first epochs' rows.
  const auto resumed = run_cli("train " + (out_ / "config.toml").string() + " --resume");
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_NE(resumed.output.find("resume: continuing from " + (dir_ / "caf\\xE9/run/checkpoints/ckpt-e0002").string()),
            std::string::npos)
      << resumed.output;  // messages quote the byte as \xE9
  const auto history = read(out_ / "history.csv");
  EXPECT_EQ(std::count(history.begin(), history.end(), '\n'), 3) << history;
  // The export predicts arrays from and into the folder.
  fastlearn::write_npy(latin1 / "rows.npy", torch::randn({5, 4}));
  const auto p = run_cli(fmt::format("predict {} {} --out {}", (out_ / "export.safetensors").string(),
                                     (latin1 / "rows.npy").string(), (latin1 / "predicted").string()));
  EXPECT_EQ(p.exit_code, 0) << p.output;
  EXPECT_EQ(fastlearn::read_npy(latin1 / "predicted" / "rows.npy").size(0), 5);
}

TEST_F(TrainCommand, AnInvalidConfigWritesNothing) {
  std::ofstream(config_, std::ios::app) << "epoch = 3\n";
  const auto r = run_cli(train(""));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("run.toml:16:1: unknown key train.epoch; did you mean train.epochs?"), std::string::npos)
      << r.output;
  EXPECT_FALSE(fs::exists(out_));
  const auto bad_set = run_cli(train("--set data.bs=-1 --nproc-per-node 2"));
  EXPECT_NE(bad_set.exit_code, 0);
  EXPECT_NE(bad_set.output.find("--set data.bs=-1: data.bs must be an integer >= 1, not the integer -1"),
            std::string::npos)
      << bad_set.output;
  EXPECT_EQ(bad_set.output.find("[rank"), std::string::npos) << "no rank was started:\n" << bad_set.output;
  EXPECT_FALSE(fs::exists(out_));
}

TEST_F(TrainCommand, ARelativeDataPathThatIsNotThereNamesTheWorkingDirectory) {
  const auto config = dir_ / "images.toml";
  std::ofstream(config)
      << "[data]\ndataset = \"image_folder\"\npath = \"no/such/folder\"\n[model]\narch = \"resnet18\"\n";
  const auto r = run_cli(fmt::format("train '{}' --out '{}'", config.string(), out_.string()));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find(fmt::format("data.path 'no/such/folder' (relative to the working directory {}) "
                                      "(data.dataset = \"image_folder\") is not a folder",
                                      fs::current_path().string())),
            std::string::npos)
      << r.output;
  EXPECT_FALSE(fs::exists(out_));
}

TEST_F(TrainCommand, ResumeContinuesFromTheNewestCheckpointMidEpoch) {
  const std::string sets = "--set train.epochs=3 --set output.checkpoint_every_n_batches=3";
  ASSERT_EQ(run_cli(train(sets)).exit_code, 0);
  const auto full = nlohmann::json::parse(read(out_ / "metrics.json"));
  // As if the run died during the last epoch: its end-of-epoch checkpoint is gone, a mid-epoch one is left.
  fs::remove(out_ / "checkpoints/ckpt-e0003-b0000000.safetensors");
  const auto r = run_cli(train(sets + " --resume"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("resume: continuing from " + (out_ / "checkpoints/ckpt-e0002-b").string()), std::string::npos)
      << r.output;
  const auto resumed = nlohmann::json::parse(read(out_ / "metrics.json"));
  ASSERT_EQ(resumed.size(), 3u) << resumed;
  EXPECT_EQ(resumed[2]["epoch"], 2);
  // The same data order, weights, optimizer state and schedule position: the uninterrupted run's last epoch.
  EXPECT_EQ(resumed[2]["valid_loss"].get<double>(), full[2]["valid_loss"].get<double>());
  EXPECT_EQ(resumed[2]["train_loss"].get<double>(), full[2]["train_loss"].get<double>());
}

// train.schedule = "fine_tune": a frozen fit of 1 epoch, then an unfrozen one of train.epochs, numbered on. A run
// that died in the unfrozen fit resumes from its newest checkpoint (of the unfrozen fit: the frozen one is
// skipped) and ends as the uninterrupted run did; metrics.json holds both fits' epochs.
TEST_F(TrainCommand, AFineTuneResumesInsideItsUnfrozenFit) {
  const auto skip =
      write_image_folder_config("schedule = \"fine_tune\"\n", "[output]\ncheckpoint_every_n_batches = 2\n");
  if (!skip.empty()) GTEST_SKIP() << skip;
  ASSERT_EQ(run_cli(train("")).exit_code, 0);
  const auto full = nlohmann::json::parse(read(out_ / "metrics.json"));
  ASSERT_EQ(full.size(), 3u) << "the frozen epoch and the 2 unfrozen ones: " << full;
  for (int e = 0; e < 3; ++e) EXPECT_EQ(full[e]["epoch"], e) << full;
  const auto history = read(out_ / "history.csv");
  EXPECT_EQ(std::count(history.begin(), history.end(), '\n'), 4) << "the header and 3 epochs:\n" << history;
  // As if the run died in the unfrozen fit's last epoch: the newest checkpoint left is one inside that epoch.
  const auto last = out_ / "checkpoints/ckpt-e0003-b0000000.safetensors";
  ASSERT_TRUE(fs::exists(last));
  fs::remove(last);
  const auto r = run_cli(train("--resume"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("resume: continuing from " + (out_ / "checkpoints/ckpt-e0002-b").string()), std::string::npos)
      << r.output;
  const auto resumed = nlohmann::json::parse(read(out_ / "metrics.json"));
  ASSERT_EQ(resumed.size(), 3u) << resumed;
  for (int e = 0; e < 3; ++e) {
    EXPECT_EQ(resumed[e]["epoch"], e) << resumed;
    for (const char* key : {"train_loss", "valid_loss", "accuracy"})
      EXPECT_EQ(resumed[e][key].get<double>(), full[e][key].get<double>()) << "epoch " << e << " " << key;
  }
}

TEST_F(TrainCommand, ARunThatFailsBeforeTrainingLeavesTheOlderRunsFolderAsItWas) {
  ASSERT_EQ(run_cli(train("--set train.epochs=2")).exit_code, 0);
  const auto config_before = read(out_ / "config.toml"), history_before = read(out_ / "history.csv");
  const auto checkpoints = [this] {
    std::set<std::string> names;
    for (const auto& e : fs::directory_iterator(out_ / "checkpoints")) names.insert(e.path().filename().string());
    return names;
  };
  const auto checkpoints_before = checkpoints();
  ASSERT_TRUE(checkpoints_before.contains("ckpt-e0002-b0000000.safetensors"));
  // Resuming with another model: its checkpoint does not load, and the folder must stay the older run's.
  const auto other_model = run_cli(train("--set model.hidden=[8] --resume"));
  EXPECT_NE(other_model.exit_code, 0) << other_model.output;
  EXPECT_EQ(read(out_ / "config.toml"), config_before);
  EXPECT_EQ(read(out_ / "history.csv"), history_before);
  EXPECT_EQ(checkpoints(), checkpoints_before);
  // A fresh run that trains takes the folder over: its config, and none of the older run's checkpoints, torn ones
  // included (removed unread: no "skipping" message).
  std::ofstream(out_ / "checkpoints" / "ckpt-e0009-b0000000.safetensors") << "not a checkpoint";
  const auto fresh = run_cli(train("--set train.epochs=1 --set model.hidden=[8]"));
  ASSERT_EQ(fresh.exit_code, 0) << fresh.output;
  EXPECT_EQ(fresh.output.find("skipping checkpoint"), std::string::npos) << fresh.output;
  EXPECT_FALSE(checkpoints().contains("ckpt-e0009-b0000000.safetensors"));
  EXPECT_NE(read(out_ / "config.toml"), config_before);
  EXPECT_FALSE(checkpoints().contains("ckpt-e0002-b0000000.safetensors"));
  EXPECT_TRUE(checkpoints().contains("ckpt-e0001-b0000000.safetensors"));
}

// A fresh run sets the older run's files aside and deletes them only once it has an epoch or a checkpoint of its
// own: one that fails before (an empty image found by the loader in its first batches) puts them back. A run killed
// before that point leaves them aside, and the next run into the folder puts them back before anything else.
TEST_F(TrainCommand, ARunThatFailsInItsFirstEpochPutsTheOlderRunsFilesBack) {
  const auto [made, why] = fastlearn::testing::run_shell(
      fmt::format("'{}' '{}/scripts/make-image-folders' '{}' --train 10 --valid 4 --classes 2 2>&1", FASTLEARN_PYTHON,
                  FASTLEARN_SOURCE_DIR, (dir_ / "images").string()));
  if (made != 0) GTEST_SKIP() << "scripts/make-image-folders needs a Python with numpy and Pillow: " << why;
  const auto images = dir_ / "images" / "png";
  std::ofstream(config_) << fmt::format(
      "[data]\ndataset = \"image_folder\"\npath = \"{}\"\nsize = 32\nbs = 4\nworkers = 0\n[model]\narch = "
      "\"resnet18\"\n[train]\nepochs = 1\nlr = 0.002\n",
      images.string());
  ASSERT_EQ(run_cli(train("")).exit_code, 0);
  const auto snapshot = [this] {
    std::map<std::string, std::string> files;
    for (const auto& e : fs::recursive_directory_iterator(out_))
      if (e.is_regular_file()) {  // a digest: a failure prints names, not checkpoints' bytes
        const auto bytes = read(e.path());
        files[fs::relative(e.path(), out_).string()] =
            fmt::format("{} bytes, hash {:x}", bytes.size(), std::hash<std::string>{}(bytes));
      }
    return files;
  };
  const auto before = snapshot();
  ASSERT_TRUE(before.contains("checkpoints/ckpt-e0001-b0000000.safetensors"));

  std::ofstream(images / "train" / "Trouser" / "empty.png");  // zero bytes: decoded, and refused, while training
  const auto failed = run_cli(train("--set train.lr=0.001"));
  EXPECT_NE(failed.exit_code, 0) << failed.output;
  EXPECT_NE(failed.output.find("the file is empty"), std::string::npos) << failed.output;
  EXPECT_NE(failed.output.find("older run's files in " + out_.string() + " are back"), std::string::npos)
      << failed.output;
  EXPECT_EQ(snapshot(), before) << "the older run's folder, byte for byte";

  // As a run killed while its takeover was pending leaves the folder: the older files aside, its own in place.
  const auto kill_during_takeover = [this] {
    fs::create_directories(out_ / ".previous-run");
    for (const char* name : {"config.toml", "metrics.json", "history.csv", "loss.svg", "export.safetensors"})
      fs::rename(out_ / name, out_ / ".previous-run" / name);
    fs::create_directories(out_ / "checkpoints" / ".previous-run");
    for (const char* name : {"ckpt-e0001-b0000000.safetensors", "model.safetensors"})
      fs::rename(out_ / "checkpoints" / name, out_ / "checkpoints" / ".previous-run" / name);
    std::ofstream(out_ / "config.toml") << "# the killed run's\n";
    std::ofstream(out_ / "history.csv") << "epoch,train_loss\n";
  };
  kill_during_takeover();
  const auto next = run_cli(train("--set train.lr=0.001"));
  EXPECT_NE(next.exit_code, 0) << "the empty image is still there: " << next.output;
  EXPECT_NE(next.output.find("was killed while taking it over"), std::string::npos) << next.output;
  EXPECT_EQ(snapshot(), before);
  // --resume after such a kill continues the new run (here from its start: it has no checkpoint), not the older
  // one; failing again, it puts the older run back all the same.
  kill_during_takeover();
  const auto resumed = run_cli(train("--set train.lr=0.001 --resume"));
  EXPECT_NE(resumed.exit_code, 0) << resumed.output;
  EXPECT_NE(resumed.output.find("no checkpoint in"), std::string::npos) << resumed.output;
  EXPECT_EQ(resumed.output.find("continuing from"), std::string::npos) << resumed.output;
  EXPECT_EQ(snapshot(), before);
  // Only the files a run writes move: one of the user's in checkpoints/ stays where it is throughout.
  std::ofstream(out_ / "checkpoints" / "notes.txt") << "mine\n";
  fs::remove(images / "train" / "Trouser" / "empty.png");
  ASSERT_EQ(run_cli(train("--set train.lr=0.001")).exit_code, 0);
  EXPECT_FALSE(fs::exists(out_ / ".previous-run")) << "a run that trained an epoch deletes the older run's files";
  EXPECT_FALSE(fs::exists(out_ / "checkpoints" / ".previous-run"));
  EXPECT_NE(snapshot().at("config.toml"), before.at("config.toml"));
  EXPECT_EQ(read(out_ / "checkpoints" / "notes.txt"), "mine\n");
}

// While a run trains into a folder it holds the folder's lock: a second run into it stops at once with an error and
// changes nothing there; once the lock is free, a run goes ahead. A folder made only to fail in is not left behind.
TEST_F(TrainCommand, ASecondRunIntoAFolderInUseStopsAtOnce) {
  ASSERT_EQ(run_cli(train("--set train.epochs=1")).exit_code, 0);
  const auto config_before = read(out_ / "config.toml");
  const int held = open(out_.c_str(), O_RDONLY | O_CLOEXEC);  // as the running run holds it
  ASSERT_GE(held, 0);
  ASSERT_EQ(flock(held, LOCK_EX | LOCK_NB), 0);
  const auto second = run_cli(train("--set train.epochs=1 --set model.hidden=[8]"));
  EXPECT_NE(second.exit_code, 0) << second.output;
  EXPECT_NE(second.output.find("--out " + out_.string() + ": another fastlearn run is training into this folder"),
            std::string::npos)
      << second.output;
  EXPECT_EQ(read(out_ / "config.toml"), config_before);
  const auto two_ranks = run_cli(train("--set train.epochs=1 --nproc-per-node 2"));
  EXPECT_NE(two_ranks.exit_code, 0) << two_ranks.output;
  EXPECT_NE(two_ranks.output.find("another fastlearn run is training into this folder"), std::string::npos)
      << two_ranks.output;
  close(held);
  EXPECT_EQ(run_cli(train("--set train.epochs=1 --set model.hidden=[8]")).exit_code, 0) << "the lock is free again";
  EXPECT_NE(read(out_ / "config.toml"), config_before);

  const auto fresh = dir_ / "fresh";
  std::ofstream(dir_ / "no_y.csv") << "a,b\n1,2\n3,4\n";
  std::ofstream(dir_ / "table.toml") << fmt::format(
      "[data]\ndataset = \"csv\"\npath = \"{}\"\ny_names = [\"y\"]\ncont_names = [\"a\"]\n[model]\narch = "
      "\"tabular\"\n",
      (dir_ / "no_y.csv").string());
  const auto bad = run_cli("train " + (dir_ / "table.toml").string() + " --out " + fresh.string());
  EXPECT_NE(bad.exit_code, 0) << bad.output;
  EXPECT_FALSE(fs::exists(fresh)) << "a run that failed left the folder it made";
}

TEST_F(TrainCommand, ValidatingWithAConfigThatBuildsAnotherModelPointsAtTheRunsOwnConfig) {
  ASSERT_EQ(run_cli(train("--set train.epochs=1 --set model.hidden=[8]")).exit_code, 0);
  const auto checkpoint = (out_ / "checkpoints/model.safetensors").string();
  const auto base = run_cli("validate " + config_.string() + " --checkpoint " + checkpoint);
  EXPECT_NE(base.exit_code, 0) << base.output;
  EXPECT_NE(base.output.find("left its resolved config in '" + (out_ / "config.toml").string() + "'"),
            std::string::npos)
      << base.output;
  const auto own = run_cli("validate " + (out_ / "config.toml").string() + " --checkpoint " + checkpoint);
  EXPECT_EQ(own.exit_code, 0) << own.output;
}

TEST_F(TrainCommand, TrainsOnTwoRanksThroughTheLauncher) {
  const auto r = run_cli(train("--nproc-per-node 2 --set train.epochs=1"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("[rank 0] final validation set: "), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("[rank 1] final"), std::string::npos) << "rank 0 alone reports:\n" << r.output;
  EXPECT_EQ(nlohmann::json::parse(read(out_ / "metrics.json")).size(), 1u);
  EXPECT_TRUE(fs::is_regular_file(out_ / "checkpoints/model.safetensors"));
  // Resumed in one process, a 2-rank run's checkpoint says so: another global batch and data order.
  const auto one = run_cli(train("--set train.epochs=1 --resume"));
  ASSERT_EQ(one.exit_code, 0) << one.output;
  EXPECT_NE(one.output.find("resume: warning: the checkpoint was written by 2 rank(s) and this run has 1"),
            std::string::npos)
      << one.output;
  const auto two = run_cli(train("--nproc-per-node 2 --set train.epochs=1 --resume"));
  ASSERT_EQ(two.exit_code, 0) << two.output;
  EXPECT_EQ(two.output.find("resume: warning"), std::string::npos) << two.output;
}

TEST_F(TrainCommand, TrainsOnTwoCpuReplicasOfOneProcess) {
  std::ofstream(config_, std::ios::app) << "[distributed]\ndevices = [\"cpu\", \"cpu\"]\n";
  const auto r = run_cli(train("--set train.epochs=1"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("training on 2 devices of this process: cpu, cpu"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("final validation set: "), std::string::npos) << r.output;
  // Several devices of one process and several processes do not combine: refused before anything starts.
  const auto both = run_cli(train("--nproc-per-node 2"));
  EXPECT_NE(both.exit_code, 0) << both.output;
  EXPECT_NE(both.output.find("distributed.devices trains several devices in this one process, and 2 ranks"),
            std::string::npos)
      << both.output;
  EXPECT_EQ(both.output.find("[rank"), std::string::npos) << both.output;
}

TEST_F(TrainCommand, LrFindWritesThePlotAndSuggests) {
  const auto r = run_cli("lr-find " + config_.string() + " --out " + out_.string());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("suggested learning rates (fastai's rules): minimum "), std::string::npos) << r.output;
  EXPECT_NE(read(out_ / "lr_find.svg").find("<svg"), std::string::npos);
}

// ---- bad distributed input: a clear error naming the setting, a non-zero exit, nothing written ----------

TEST_F(TrainCommand, NcclWithoutAGpuIsRefusedByName) {
  const auto r = run_cli(train("--set distributed.backend=nccl"));
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("distributed.backend = \"nccl\" needs a CUDA GPU and none is visible"), std::string::npos)
      << r.output;
  EXPECT_FALSE(fs::exists(out_)) << "nothing written";
}

TEST_F(TrainCommand, AGpuDeviceWithoutAGpuOrMoreRanksThanGpusIsRefusedBeforeLaunch) {
  // The CPU tests hide every GPU from the CLI (support/cpu_only.cpp).
  for (const char* device : {"cuda", "cuda:1"}) {
    const auto r = run_cli(train(std::string("--set train.device=") + device));
    EXPECT_NE(r.exit_code, 0) << r.output;
    EXPECT_NE(
        r.output.find(fmt::format("train.device = \"{}\" needs a CUDA GPU and none is visible; use \"cpu\"", device)),
        std::string::npos)
        << r.output;
    EXPECT_FALSE(fs::exists(out_)) << "nothing written";
  }
  // Before any rank starts: no launcher output, no rank prefix.
  const auto r = run_cli(train("--nproc-per-node 2 --set distributed.backend=nccl"));
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("distributed.backend = \"nccl\" needs a CUDA GPU"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("[rank"), std::string::npos) << "refused before launch: " << r.output;
  const auto lr_find = run_cli("lr-find " + config_.string() + " --set train.device=cuda --out " + out_.string());
  EXPECT_NE(lr_find.exit_code, 0);
  EXPECT_NE(lr_find.output.find("train.device = \"cuda\" needs a CUDA GPU"), std::string::npos) << lr_find.output;
}

// Ranks started by hand (as a scheduler would), with the given RANK / WORLD_SIZE and a 3 s timeout.
std::vector<fastlearn::testing::CommandResult> start_ranks(const fs::path& config, const fs::path& out,
                                                           const std::vector<int>& ranks, int world_size, int port) {
  std::vector<fastlearn::testing::Command> commands;
  for (int rank : ranks) {
    commands.push_back({.argv = {FASTLEARN_CLI, "train", config.string(), "--out", out.string(), "--set",
                                 "distributed.timeout_seconds=3"},
                        .env = {{"RANK", std::to_string(rank)},
                                {"WORLD_SIZE", std::to_string(world_size)},
                                {"LOCAL_RANK", std::to_string(rank)},
                                {"MASTER_ADDR", "127.0.0.1"},
                                {"MASTER_PORT", std::to_string(port)}},
                        .log = out.parent_path() / fmt::format("rank{}.log", rank)});
  }
  return fastlearn::testing::run_commands(commands, std::chrono::seconds(60));
}

TEST_F(TrainCommand, AWorldSizeAboveTheRanksStartedIsNamedWithinTheTimeout) {
  const auto start = std::chrono::steady_clock::now();
  const auto results = start_ranks(config_, out_, {0, 1}, 3, fastlearn::testing::free_tcp_port());
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  for (const auto& r : results) {
    EXPECT_FALSE(r.timed_out);
    EXPECT_NE(r.exit_code, 0) << r.output;
    // Rank 0 says how many came; a rank whose store (rank 0's) went away first says that, naming WORLD_SIZE too.
    EXPECT_TRUE(r.output.find("only 2 of WORLD_SIZE=3 ranks joined") != std::string::npos ||
                r.output.find("went away while waiting for WORLD_SIZE=3 ranks") != std::string::npos)
        << r.output;
  }
  EXPECT_LT(seconds, 15) << "3 s timeout";
  EXPECT_FALSE(fs::exists(out_)) << "nothing written";
}

TEST_F(TrainCommand, AnUnreachableMasterIsNamedWithinTheTimeout) {
  const int port = fastlearn::testing::free_tcp_port();  // nobody listens there: rank 0 never started
  const auto start = std::chrono::steady_clock::now();
  const auto results = start_ranks(config_, out_, {1}, 2, port);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ASSERT_EQ(results.size(), 1u);
  EXPECT_NE(results[0].exit_code, 0) << results[0].output;
  EXPECT_NE(results[0].output.find(fmt::format("MASTER_ADDR=127.0.0.1 MASTER_PORT={}", port)), std::string::npos)
      << results[0].output;
  EXPECT_LT(seconds, 15) << "3 s timeout";
  EXPECT_FALSE(fs::exists(out_)) << "nothing written";
}

TEST(TrainCommandHelp, ExplainsEveryOptionAndKey) {
  const auto r = run_cli("train --help");
  EXPECT_EQ(r.exit_code, 0);
  for (const char* part : {"--set", "--out", "--resume", "--nproc-per-node", "--max-restarts", "[train] epochs, lr",
                           "[distributed] backend, sync_bn"}) {
    EXPECT_NE(r.output.find(part), std::string::npos) << part << " in:\n" << r.output;
  }
  const auto top = run_cli("--help");
  for (const char* part : {"train", "lr-find", "validate", "launch"}) {
    EXPECT_NE(top.output.find(part), std::string::npos) << part << " in:\n" << top.output;
  }
}

}  // namespace
