// `fastlearn validate`, `interpret` and `predict`: the config's Learner with a checkpoint's weights, on the
// validation set or on the files and rows a user gives.
#include "cli/command_config.h"
#include "cli/commands.h"

#include <fastlearn/core/atomic_file.h>
#include <fastlearn/core/detail/text.h>
#include <fastlearn/data/collab_dataloaders.h>
#include <fastlearn/data/csv.h>
#include <fastlearn/data/image_dataset.h>
#include <fastlearn/data/segmentation_dataset.h>
#include <fastlearn/data/tabular_dataloaders.h>
#include <fastlearn/learner/collab_interpretation.h>
#include <fastlearn/learner/interpretation.h>
#include <fastlearn/learner/predict_image.h>
#include <fastlearn/learner/predict_tabular.h>
#include <fastlearn/learner/segmentation_results.h>
#include <fastlearn/learner/tabular_learner.h>
#include <fastlearn/learner/top_losses_grid.h>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <ATen/ATen.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <numeric>

namespace fastlearn::cli {

namespace fs = std::filesystem;

namespace {

// A DataError of one input, on stderr after what stdout holds so far; the other inputs are still predicted.
void report(const DataError& e, int& failed) {
  std::fflush(stdout);
  fmt::print(stderr, "fastlearn: error: {}\n", e.what());
  ++failed;
}

// Every row of the CSV file, one line each: FILE:ROW (the header is row 1).
void predict_rows(Learner& learn, const TrainConfig& config, const std::string& input, int& failed) {
  const auto table = read_csv(input, {.delimiter = config.data.delimiter.front()});
  const auto columns = input_columns(learn, table, input);  // other columns may be there too
  for (std::size_t r = 0; r < table.rows.size(); ++r) {
    std::map<std::string, std::string> row;
    for (const auto& [name, j] : columns) row[name] = table.rows[r][j];
    const auto where = fmt::format("{}:{}", input, r + 2);
    try {
      fmt::print("{}\t{}\n", where, describe(predict_row(learn, row, where)));
    } catch (const DataError& e) {  // the error names `where`
      report(e, failed);
    }
  }
}

// Every image file under the folder, as from_folder finds them, one line each.
void predict_folder(Learner& learn, const std::string& input, int& failed) {
  const auto files = get_image_files(input);
  if (files.empty())
    throw DataError(fmt::format("{}: a folder with no .jpg, .jpeg or .png file in it", excerpt(input, 256)));
  for (const auto& file : files) {
    try {
      fmt::print("{}\t{}\n", file.string(), describe(predict_image(learn, file)));
    } catch (const DataError& e) {
      report(e, failed);
    }
  }
}

}  // namespace

// The columns of `table` that the model reads, by name, with their index. A CSV without one of them is a mistake far
// more often than a column of missing cells (pandas, and so fastai, fail on it too): refused, naming the columns. An
// empty cell still counts as missing. Other columns (the target, an id) are left out.
std::map<std::string, std::size_t> input_columns(Learner& learn, const CsvTable& table, const std::string& file) {
  const auto* dataset = tabular_dataset(learn.dls());
  if (!dataset) return {};
  std::map<std::string, std::size_t> inputs;
  std::vector<std::string> absent;
  for (const auto* names : {&dataset->procs().cat_columns(), &dataset->procs().cont_names()})
    for (const auto& name : *names) {
      const auto at = std::find(table.columns.begin(), table.columns.end(), name);
      if (at == table.columns.end())
        absent.push_back(name);
      else
        inputs.emplace(name, static_cast<std::size_t>(at - table.columns.begin()));
    }
  if (!absent.empty())
    throw DataError(
        fmt::format("{}: no column {} that the model reads (the header has {}); give it, with empty "
                    "cells where a value is missing",
                    excerpt(file, 256), fmt::join(excerpts(absent), ", "), fmt::join(excerpts(table.columns), ", ")));
  return inputs;
}

int run_validate(const TrainArgs& args, const std::string& checkpoint) {
  auto config = read_config_file(args);
  auto learn = learner_from_checkpoint(config, config.output.dir, checkpoint, "validate");
  const auto result = learn->validate();
  fmt::print("{} set: {}\n", config.data.dataset == "fashion_mnist" ? "test" : "validation", describe(result));
  return 0;
}

namespace {

// A segmentation's interpretation: the validation images with the highest loss, listed, and drawn with their true and
// predicted masks in <out>/show_results.png.
int interpret_segmentation(const TrainConfig& config, const fs::path& out, const std::string& checkpoint, int top) {
  auto learn = learner_from_checkpoint(config, out, checkpoint, "interpret");
  const auto worst = segmentation_top_losses(*learn, top);
  const auto* items = dynamic_cast<const SegmentationDataset*>(&learn->dls().valid().dataset());
  fmt::print("top losses (validation item, counted from 0: image, loss):\n");
  std::vector<std::int64_t> indices;
  for (const auto& item : worst) {
    indices.push_back(item.index);
    fmt::print("  {}: {}, {:.4f}\n", item.index,
               items ? excerpt(items->images().at(static_cast<std::size_t>(item.index)).string(), 256) : "-",
               item.loss);
  }
  show_results(*learn, out / "show_results.png", {.items = indices});
  fmt::print("wrote {}\n", excerpt((out / "show_results.png").string(), 256));
  return 0;
}

// A ratings model's interpretation, as fastai's lesson reads it: among the items rated most in training (up to 1,000:
// their biases and factors rest on many ratings), the `top` most and least liked whatever the user, and the first 50
// of them along the first two principal components of their factors in <out>/item_factors.svg.
int interpret_ratings(const TrainConfig& config, const fs::path& out, const std::string& checkpoint, int top) {
  if (config.model.arch != "collab")
    throw ConfigError(
        fmt::format("interpret: a ratings model is read by its biases and factors, which the dot-product model has "
                    "(model.arch = \"collab\"); this config's is \"{}\"",
                    excerpt(config.model.arch)));
  auto learn = learner_from_checkpoint(config, out, checkpoint, "interpret");
  const auto classes = *collab_classes(learn->dls());
  const auto* train = dynamic_cast<const TensorDataset*>(&learn->dls().train().dataset());
  const auto counts =
      at::bincount(train->inputs().at(0).select(1, 1), {}, static_cast<std::int64_t>(classes.items.size()))
          .contiguous();
  std::vector<std::int64_t> order(classes.items.size() - 1);
  std::iota(order.begin(), order.end(), std::int64_t{1});  // not "#na#"
  const auto* n = counts.data_ptr<std::int64_t>();
  std::stable_sort(order.begin(), order.end(), [&](std::int64_t a, std::int64_t b) { return n[a] > n[b]; });
  order.resize(std::min<std::size_t>(order.size(), 1000));
  std::vector<std::string> popular;
  for (const auto code : order) popular.push_back(classes.items[static_cast<std::size_t>(code)]);
  for (const bool most : {true, false}) {
    fmt::print("{} liked whatever the user, among the {} items rated most ({}: bias):\n", most ? "most" : "least",
               popular.size(), classes.item);
    for (const auto& [item, bias] : items_by_bias(*learn, top, most, popular)) fmt::print("  {}: {:.4f}\n", item, bias);
  }
  if (popular.size() < 2 || config.model.n_factors < 2) {
    fmt::print("no item_factors.svg: its picture needs 2 items and 2 factors ({} and {})\n", popular.size(),
               config.model.n_factors);
  } else {
    const std::vector<std::string> shown(popular.begin(),
                                         popular.begin() + std::min<std::ptrdiff_t>(50, popular.size()));
    plot_item_factors(*learn, shown, out / "item_factors.svg");
    fmt::print("wrote {}\n", excerpt((out / "item_factors.svg").string(), 256));
  }
  return 0;
}

}  // namespace

int run_interpret(const TrainArgs& args, const std::string& checkpoint, int top) {
  auto config = read_config_file(args);
  if (is_ratings(config.data))
    return interpret_ratings(config, args.out.empty() ? fs::path(config.output.dir) : fs::path(args.out), checkpoint,
                             top);
  if (task_of(config.data) == Task::segmentation)
    return interpret_segmentation(config, args.out.empty() ? fs::path(config.output.dir) : fs::path(args.out),
                                  checkpoint, top);
  if (task_of(config.data) != Task::classification) {
    throw ConfigError(
        fmt::format("interpret: {} is not single-label classification (data.dataset = \"{}\"); "
                    "interpret reads a classifier's confusions",
                    excerpt(args.config_path, 256), config.data.dataset));
  }
  const fs::path out = args.out.empty() ? fs::path(config.output.dir) : fs::path(args.out);
  auto learn = learner_from_checkpoint(config, out, checkpoint, "interpret");
  const auto interp = ClassificationInterpretation::from_learner(*learn);
  const auto& vocab = interp.vocab();
  const auto cm = interp.confusion_matrix();
  const auto* counts = cm.data_ptr<std::int64_t>();
  const auto c = static_cast<std::int64_t>(vocab.size());
  std::string table = "actual," + fmt::format("{}", fmt::join(vocab, ",")) + "\n";
  // Columns as wide as the longest class name (at least 6), headed by the predicted class's name.
  std::size_t width = 6;
  for (const auto& name : vocab) width = std::max(width, name.size());
  fmt::print("confusion matrix (rows: actual, columns: predicted)\n{:>{}}", "", width);
  for (const auto& name : vocab) fmt::print(" {:>{}}", name, width);
  fmt::print("\n");
  for (std::int64_t a = 0; a < c; ++a) {
    const auto& name = vocab[static_cast<std::size_t>(a)];
    std::vector<std::int64_t> row(counts + a * c, counts + (a + 1) * c);
    fmt::print("{:>{}}", name, width);
    for (auto n : row) fmt::print(" {:>{}}", n, width);
    fmt::print("\n");
    table += fmt::format("{},{}\n", name, fmt::join(row, ","));
  }
  fmt::print("most confused (actual -> predicted: items):\n");
  const auto confused = interp.most_confused();
  for (std::size_t i = 0; i < std::min<std::size_t>(confused.size(), 10); ++i) {
    fmt::print("  {} -> {}: {}\n", confused[i].actual, confused[i].predicted, confused[i].count);
  }
  fs::create_directories(out);
  write_file_atomically(out / "confusion_matrix.csv", table);
  if (!is_images(config.data)) {
    fmt::print("top losses (validation row, counted from 0: actual, predicted (its probability), loss):\n");
    for (const auto& item : interp.top_losses(top)) {
      fmt::print("  {}: {}, {} ({:.3f}), {:.3f}\n", item.index, item.actual, item.predicted, item.probability,
                 item.loss);
    }
    fmt::print("wrote {}\n", excerpt((out / "confusion_matrix.csv").string(), 256));
    return 0;
  }
  save_top_losses_grid(interp, learn->dls().valid().dataset(), top, out / "top_losses.svg");
  fmt::print("wrote {} and {}\n", excerpt((out / "confusion_matrix.csv").string(), 256),
             excerpt((out / "top_losses.svg").string(), 256));
  return 0;
}

int run_predict(const TrainArgs& args, const std::string& checkpoint, const std::vector<std::string>& inputs) {
  auto config = read_config_file(args);
  const bool rows = is_tabular(config.data) || is_ratings(config.data);
  if (!is_image_files(config.data) && !rows) {
    throw ConfigError(
        fmt::format("predict: {} has data.dataset = \"{}\"; predict takes image files (data.dataset = "
                    "\"image_folder\" or \"image_csv\") or CSV rows (data.dataset = \"csv\" or \"ratings\")",
                    excerpt(args.config_path, 256), config.data.dataset));
  }
  if (config.data.dataset == "segmentation") {
    throw ConfigError(fmt::format(
        "predict: {} is a segmentation, whose masks go to a folder: `fastlearn export {} --checkpoint {} --out DIR`, "
        "then `fastlearn predict DIR/export.safetensors IMAGE... --out MASKS`",
        excerpt(args.config_path, 256), excerpt(args.config_path, 256), excerpt(checkpoint, 256)));
  }
  auto learn = learner_from_checkpoint(config, config.output.dir, checkpoint, "predict");
  int failed = 0;
  for (const auto& input : inputs) {
    try {
      if (rows)
        predict_rows(*learn, config, input, failed);
      else if (fs::is_directory(input))
        predict_folder(*learn, input, failed);
      else
        fmt::print("{}\t{}\n", input, describe(predict_image(*learn, input)));
    } catch (const DataError& e) {
      report(e, failed);
    }
  }
  return failed == 0 ? 0 : 1;
}

}  // namespace fastlearn::cli
