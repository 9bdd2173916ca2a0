#pragma once
// Per-epoch logs written to files as training goes: CSVLogger (a table, flushed after every epoch)
// and MetricsJson (metrics.json: a list of records rewritten atomically after every epoch).
#include <fastlearn/learner/callback.h>

#include <filesystem>
#include <fstream>
#include <string>

namespace fastlearn {

struct CSVLoggerOptions {
  std::filesystem::path file = "history.csv";  ///< relative paths are under the learner's path
  /// Keep the earlier rows (and the header) of an existing file, as fastai's append: a fit adds its rows after
  /// them. Whatever this says, a fit that continues a training keeps the rows of the epochs before it and drops
  /// any after (a fit resumed from a checkpoint, starting at epoch k > 0; fine_tune's unfrozen fit).
  bool append = false;
};

/// Writes a header (epoch, train_loss, valid_loss, metrics, time) and one row per epoch.
class CSVLogger : public Callback {
 public:
  explicit CSVLogger(CSVLoggerOptions options = {});
  std::string name() const override { return "csv_logger"; }
  bool rank0_only() const override { return true; }
  void before_fit() override;
  void after_epoch() override;
  void after_fit() override;
  /// The file written to (resolved against the learner's path at before_fit).
  const std::filesystem::path& path() const { return path_; }

 private:
  CSVLoggerOptions options_;
  std::filesystem::path path_;
  std::ofstream out_;
};

struct MetricsJsonOptions {
  std::filesystem::path file = "metrics.json";  ///< relative paths are under the learner's path
};

/// metrics.json: [{"epoch": 0, "train_loss": .., "valid_loss": .., "<metric>": .., "seconds": ..}, ...];
/// NaN values (e.g. a skipped validation) are written as null.
class MetricsJson : public Callback {
 public:
  explicit MetricsJson(MetricsJsonOptions options = {});
  std::string name() const override { return "metrics_json"; }
  bool rank0_only() const override { return true; }
  void before_fit() override;
  void after_epoch() override;
  const std::filesystem::path& path() const { return path_; }

 private:
  MetricsJsonOptions options_;
  std::filesystem::path path_;
  std::string records_;  // the JSON array's elements written so far
};

}  // namespace fastlearn
