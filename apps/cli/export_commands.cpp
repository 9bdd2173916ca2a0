// `fastlearn export` (an export of an older run's checkpoint) and `fastlearn predict EXPORT INPUT...` (predictions
// from an export alone: no config, no training data), in batches through test_dl and get_preds; a model of tensors
// (a program's export) from .npy and safetensors files, its outputs written the same way.
#include "cli/command_config.h"
#include "cli/mask_predictions.h"

#include <fastlearn/config/load_learner.h>
#include <fastlearn/core/atomic_file.h>
#include <fastlearn/core/detail/text.h>
#include <fastlearn/core/error.h>
#include <fastlearn/core/safetensors.h>
#include <fastlearn/data/csv.h>
#include <fastlearn/data/image_dataloaders.h>
#include <fastlearn/data/image_dataset.h>
#include <fastlearn/data/inference_pipeline.h>
#include <fastlearn/data/npy.h>
#include <fastlearn/data/tabular_dataloaders.h>
#include <fastlearn/learner/named_predictions.h>
#include <fastlearn/learner/predict_image.h>
#include <fastlearn/learner/predict_tabular.h>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/torch.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

namespace fastlearn::cli {

namespace fs = std::filesystem;

namespace {

// The rows of predictions.csv and the lines printed: an input's name and its prediction over the outputs.
struct Predicted {
  std::string input;
  NamedPrediction named;
  std::vector<double> outputs;  // every output: class probabilities, or values
};

class Predictions {
 public:
  explicit Predictions(Learner& learn)
      : learn_(learn), values_(predicts_values(learn)), significant_(values_ || tabular_dataset(learn.dls())) {}

  // Predicts `inputs` (names as printed) from `dl` in batches; prints a line each.
  void add(const std::vector<std::string>& inputs, DataLoader& dl, double threshold) {
    auto preds = learn_.get_preds(&dl).preds.to(torch::kCPU, torch::kDouble).contiguous();
    if (preds.dim() == 1) preds = preds.unsqueeze(1);  // one value per item (a ratings model)
    const auto named = name_predictions(preds, learn_, threshold);
    const auto* p = preds.data_ptr<double>();
    const auto c = preds.size(1);
    for (std::size_t i = 0; i < inputs.size(); ++i, p += c) add(inputs[i], named[i], std::vector<double>(p, p + c));
  }

  void add(const std::string& input, NamedPrediction named, std::vector<double> outputs) {
    fmt::print("{}\t{}\n", input, fastlearn::describe(named, significant_));
    rows_.push_back({input, std::move(named), std::move(outputs)});
  }

  bool values() const { return values_; }

  // input, prediction (the class, classes joined by ';', or empty for values), then every output at full precision.
  void write_csv(const fs::path& file) const {
    std::vector<std::string> header{"input", "prediction"};
    for (const auto& name : output_names(learn_)) header.push_back(name);
    std::string text = csv_line(header);
    for (const auto& row : rows_) {
      std::vector<std::string> cells{row.input};
      std::vector<std::string> classes;
      if (!values_)
        for (const auto& [name, probability] : row.named) classes.push_back(name);
      cells.push_back(fmt::format("{}", fmt::join(classes, ";")));
      for (const auto v : row.outputs) cells.push_back(fmt::format("{}", v));
      text += csv_line(cells);
    }
    write_file_atomically(file, text);
  }

 private:
  Learner& learn_;
  bool values_;
  bool significant_;  // as `predict CONFIG` prints: six significant digits for values and a table's classes
  std::vector<Predicted> rows_;
};

// A DataError of one input, on stderr after what stdout holds so far; the other inputs are still predicted.
void report(const Error& e, int& failed) {
  std::fflush(stdout);
  fmt::print(stderr, "fastlearn: error: {}\n", e.what());
  ++failed;
}

// Image files, in batches; when one of a batch does not decode, the files are predicted one by one so that only
// those that fail are reported.
void predict_images(Learner& learn, const std::vector<fs::path>& files, double threshold, Predictions& out,
                    int& failed) {
  if (files.empty()) return;
  std::vector<std::string> names;
  for (const auto& f : files) names.push_back(f.string());
  try {
    auto dl = ImageDataLoaders::test_dl(learn.dls(), files);
    out.add(names, dl, threshold);
    return;
  } catch (const DataError&) {}
  for (std::size_t i = 0; i < files.size(); ++i) {
    try {
      const auto p = predict_image(learn, files[i], threshold);
      const auto probs = p.probs.to(torch::kDouble).contiguous();
      out.add(names[i], p.classes,
              std::vector<double>(probs.data_ptr<double>(), probs.data_ptr<double>() + probs.numel()));
    } catch (const DataError& e) {
      report(e, failed);
    }
  }
}

// The rows of a CSV file, in batches ("FILE:ROW", the header being row 1); a row that the procs refuse makes the rows
// go one by one, so that only those are reported.
void predict_csv(Learner& learn, const std::string& input, double threshold, Predictions& out, int& failed) {
  const auto table = read_csv(input, {.delimiter = input.ends_with(".tsv") ? '\t' : ','});
  const auto columns = input_columns(learn, table, input);  // the file is refused when one is absent
  std::vector<std::string> names;
  for (std::size_t r = 0; r < table.rows.size(); ++r) names.push_back(fmt::format("{}:{}", input, r + 2));
  if (table.rows.empty()) throw DataError(fmt::format("{}: no rows to predict", excerpt(input, 256)));
  try {
    auto dl = TabularDataLoaders::test_dl(learn.dls(), table, input);
    out.add(names, dl, threshold);
    return;
  } catch (const DataError&) {  // a cell the procs refuse: the rows one by one, reporting those
  }
  for (std::size_t r = 0; r < table.rows.size(); ++r) {
    std::map<std::string, std::string> row;
    for (const auto& [name, j] : columns) row[name] = table.rows[r][j];
    try {
      const auto p = predict_row(learn, row, names[r]);
      const auto outputs = p.outputs.to(torch::kDouble).contiguous();
      auto named = name_predictions(outputs.unsqueeze(0), learn, threshold).front();
      out.add(names[r], std::move(named),
              std::vector<double>(outputs.data_ptr<double>(), outputs.data_ptr<double>() + outputs.numel()));
    } catch (const DataError& e) {
      report(e, failed);
    }
  }
}

// One file of a tensor model's inputs: an item of the export's item shape, or a batch of them.
at::Tensor tensor_batch(const at::Tensor& array, const std::vector<std::int64_t>& item, const std::string& what,
                        bool& one_item) {
  if (!at::isFloatingType(array.scalar_type()))
    throw DataError(fmt::format("{}: a {} array; the model takes float32 or float64 inputs", what,
                                c10::toString(array.scalar_type())));
  const auto sizes = array.sizes().vec();
  one_item = sizes == item;
  const bool batch = sizes.size() == item.size() + 1 && std::equal(item.begin(), item.end(), sizes.begin() + 1);
  if (!one_item && !batch)
    throw DataError(
        fmt::format("{}: an array of shape ({}), and the model takes items of shape ({}): give one item, "
                    "or a batch (N, {})",
                    what, fmt::join(sizes, ", "), fmt::join(item, ", "), fmt::join(item, ", ")));
  return (one_item ? array.unsqueeze(0) : array).to(torch::kFloat32);
}

// The outputs of a batch, 4,096 items at a time (bounded memory), as one tensor.
at::Tensor predict_in_chunks(Learner& learn, const at::Tensor& batch) {
  std::vector<at::Tensor> parts;
  for (std::int64_t start = 0; start < batch.size(0); start += 4096)
    parts.push_back(learn.predict_batch({batch.narrow(0, start, std::min<std::int64_t>(4096, batch.size(0) - start))})
                        .to(torch::kCPU));
  return parts.empty() ? learn.predict_batch({batch}).to(torch::kCPU) : at::cat(parts);
}

// A tensor model's inputs from .npy and .safetensors files (each array an item or a batch); the outputs go to
// `out` in the same format and file name (a safetensors file's arrays under their names). A line per file.
int predict_tensor_files(Learner& learn, const std::vector<std::int64_t>& item, const std::vector<std::string>& inputs,
                         const std::string& out) {
  if (out.empty())
    throw ConfigError(
        "predict: a model of tensors writes its outputs as files like its inputs: give --out DIR (each input's "
        "outputs go to DIR under its file name)");
  std::map<std::string, std::string> written;  // file name -> input
  int failed = 0;
  for (const auto& input : inputs) {
    try {
      const fs::path file(input);
      const auto name = file.filename().string();
      const auto target = fs::path(out) / name;
      if (const auto other = written.find(name); other != written.end())
        throw DataError(fmt::format("{}: its outputs would overwrite those of {} ({}): give inputs of distinct names",
                                    excerpt(input, 256), excerpt(other->second, 256), excerpt(target.string(), 256)));
      const auto shape = [](const at::Tensor& t) { return fmt::format("({})", fmt::join(t.sizes(), ", ")); };
      if (input.ends_with(".npy")) {
        bool one = false;
        const auto x = tensor_batch(read_npy(file), item, excerpt(input, 256), one);
        auto y = predict_in_chunks(learn, x);
        if (one) y = y.squeeze(0);
        fs::create_directories(out);
        write_npy(target, y.contiguous());
        fmt::print("{}\t{} {} -> outputs {} in {}\n", input, one ? "item" : "batch", shape(one ? x[0] : x), shape(y),
                   target.string());
      } else if (input.ends_with(".safetensors")) {
        const auto content = load_safetensors(file);
        if (content.tensors.empty()) throw DataError(fmt::format("{}: holds no array", excerpt(input, 256)));
        NamedTensors outputs;
        for (const auto& [tensor_name, array] : content.tensors) {
          bool one = false;
          const auto x =
              tensor_batch(array, item, fmt::format("{} '{}'", excerpt(input, 256), excerpt(tensor_name)), one);
          auto y = predict_in_chunks(learn, x);
          if (one) y = y.squeeze(0);
          outputs.emplace_back(tensor_name, y.contiguous());
          fmt::print("{} '{}'\t{} {} -> outputs {}\n", input, tensor_name, one ? "item" : "batch",
                     shape(one ? x[0] : x), shape(y));
        }
        fs::create_directories(out);
        save_safetensors(target, outputs);
        fmt::print("{}\twrote {}\n", input, target.string());
      } else {
        throw DataError(fmt::format("{}: a model of tensors reads .npy and .safetensors files", excerpt(input, 256)));
      }
      written[name] = input;
    } catch (const DataError& e) {
      report(e, failed);
    } catch (const CheckpointError& e) {  // a corrupt safetensors file
      report(e, failed);
    }
  }
  return failed == 0 ? 0 : 1;
}

}  // namespace

int run_export(const TrainArgs& args, const std::string& checkpoint) {
  auto config = read_config_file(args);
  const fs::path out = args.out.empty() ? fs::path(config.output.dir) : fs::path(args.out);
  auto learn = learner_from_checkpoint(config, out, checkpoint, "export");
  const auto file = learn->export_to(fs::absolute(out / "export.safetensors"));
  fmt::print("wrote {}\n", excerpt(file.string(), 256));
  return 0;
}

int run_predict_export(const std::string& export_file, const std::vector<std::string>& inputs, const std::string& out,
                       int workers) {
  if (export_file.ends_with(".toml"))
    throw ConfigError(fmt::format(
        "predict: {} is a config: give the checkpoint whose weights go into its model (--checkpoint FILE), or "
        "predict from the run's export.safetensors alone",
        excerpt(export_file, 256)));
  const auto contents = read_export(export_file);  // read once: the Learner and the threshold
  auto learn = load_learner(contents, export_file, {.num_workers = workers});
  const auto threshold = contents.threshold;
  const bool table = tabular_dataset(learn->dls()) != nullptr;
  if (contents.pipeline.kind == InferencePipeline::Kind::tensors) {
    const auto& model_inputs = contents.pipeline.inputs;
    if (model_inputs.size() != 1 || model_inputs[0].dtype != "float32")
      throw ConfigError(fmt::format(
          "predict: {} holds a model of {} inputs ({}); `fastlearn predict` hands over one float32 array a file: "
          "predict it from a program (fl_predict_n, or load_learner and predict_batch_outputs)",
          excerpt(export_file, 256), model_inputs.size(), model_inputs[0].dtype));
    return predict_tensor_files(*learn, model_inputs[0].shape, inputs, out);
  }
  if (contents.pipeline.masks()) return predict_mask_files(*learn, inputs, out);
  if (!table && learn->dls().image_pipeline() == nullptr)
    throw ConfigError(fmt::format(
        "predict: {} holds a model of the program's own data, with no pipeline to read new items; predict it from "
        "a program (load_learner, then get_preds on a DataLoader of your items)",
        excerpt(export_file, 256)));
  Predictions predictions(*learn);
  int failed = 0;
  std::vector<fs::path> files;  // image files, predicted together
  for (const auto& input : inputs) {
    try {
      if (table) {
        predict_csv(*learn, input, threshold, predictions, failed);
      } else {
        const auto found = image_files_of(input);
        files.insert(files.end(), found.begin(), found.end());
      }
    } catch (const DataError& e) {
      report(e, failed);
    }
  }
  predict_images(*learn, files, threshold, predictions, failed);
  if (!out.empty()) {
    fs::create_directories(out);
    predictions.write_csv(fs::path(out) / "predictions.csv");
    std::fflush(stdout);
    fmt::print(stderr, "wrote {}\n", excerpt((fs::path(out) / "predictions.csv").string(), 256));
  }
  return failed == 0 ? 0 : 1;
}

}  // namespace fastlearn::cli
