#pragma once
// The training commands of the `fastlearn` CLI on a TrainConfig: train (on this process, or on
// N local ranks through the launcher), lr-find, validate, interpret and predict. Each returns the process exit code.
#include <string>
#include <vector>

namespace fastlearn::cli {

struct TrainArgs {
  std::string config_path;
  std::vector<std::string> sets;  ///< --set key=value, in order
  std::string out;                ///< empty: output.dir of the config
  bool resume = false;
  int nproc_per_node = 0;  ///< > 0: start this many local ranks through the launcher (unless under one)
  int max_restarts = 0;
};

/// `fastlearn train`: validates the config (nothing is written before it is valid), then trains and
/// writes the run's folder (config.toml, metrics.json, history.csv, checkpoints/, loss.svg).
int run_train(const TrainArgs& args);

/// `fastlearn lr-find`: the learning-rate range test; writes <out>/lr_find.svg, prints the suggestion.
int run_lr_find(const TrainArgs& args);

/// `fastlearn validate`: loads the checkpoint's weights into the config's model and prints the loss and
/// metrics on the validation (for Fashion-MNIST: test) set.
int run_validate(const TrainArgs& args, const std::string& checkpoint);

/// `fastlearn interpret`: loads the checkpoint's weights into the config's model (single-label
/// classification) and, on the validation set, prints the confusion matrix and the most confused pairs of
/// classes, and writes <out>/confusion_matrix.csv and <out>/top_losses.svg (the `top` worst items); for ratings
/// (model.arch "collab") the `top` most and least liked items and <out>/item_factors.svg.
int run_interpret(const TrainArgs& args, const std::string& checkpoint, int top);

/// `fastlearn predict`: loads the checkpoint's weights into the config's model (image data) and prints one
/// line per image file: the file, a tab, then the class and its probability (multi-label: every class at or
/// above 0.5). A file that does not decode is reported on stderr and makes the exit code 1; the others are
/// still predicted.
int run_predict(const TrainArgs& args, const std::string& checkpoint, const std::vector<std::string>& inputs);

/// `fastlearn export`: loads the checkpoint's weights into the config's model and writes <out>/export.safetensors,
/// which `predict EXPORT` and load_learner read without the config or the data.
int run_export(const TrainArgs& args, const std::string& checkpoint);

/// `fastlearn predict EXPORT INPUT...`: the export alone (no config, no training data) predicts image files and
/// folders, or a table's CSV files, in batches (test_dl, get_preds with `workers` decoding threads); one line per
/// item as run_predict prints, and with `out` <out>/predictions.csv (input, prediction, every output).
int run_predict_export(const std::string& export_file, const std::vector<std::string>& inputs, const std::string& out,
                       int workers);

}  // namespace fastlearn::cli
