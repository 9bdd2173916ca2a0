#pragma once
// Predictions for rows of a table: the row (column name -> cell, as read from a CSV file) goes through the
// procs fitted on the training rows (unknown categories and missing cells as in training), the model runs
// in eval mode, and the result names the class or the targets.
#include <fastlearn/learner/learner.h>

#include <map>
#include <string>
#include <utility>
#include <vector>

namespace fastlearn {

struct TabularPrediction {
  /// Classification: the most probable class and its probability; regression: each target's name and value.
  std::vector<std::pair<std::string, double>> values;
  at::Tensor outputs;  ///< every class's probability, or the predicted values, on the CPU
};

/// `row` through `learn`'s tabular data pipeline (TabularDataLoaders; ConfigError otherwise); absent columns
/// are missing cells, the target columns are ignored, a column the model does not read (a typo: "colour") is a
/// DataError naming it and the closest input column, and a continuous cell that is not a number is a DataError
/// naming `origin` and the column
/// ("predict_row: column 'age': 'abc' is not a number ..."; the CLI gives "rows.csv:5").
TabularPrediction predict_row(Learner& learn, const std::map<std::string, std::string>& row,
                              const std::string& origin = "predict_row");

/// "<50k 0.873" or, for regression, "income 51234.5" (each target).
std::string describe(const TabularPrediction& prediction);

}  // namespace fastlearn
