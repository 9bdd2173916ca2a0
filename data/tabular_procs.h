#pragma once
// fastai's tabular preprocessing, fitted on the training rows only and saved with the model:
//   Categorify:  per categorical column, a vocabulary of its training values, sorted (numerically when every
//                value is a number, as pandas reads such a column), with "#na#" at index 0 for missing cells and
//                for values first seen in validation or at predict time. A column whose values are all numbers
//                is matched by number, in training and after: "1", "1.0" and "1e0" are one category, spelled in
//                the vocabulary as its first training row spells it (pandas writes an integer column with a
//                missing cell as "1.0", "2.0", ...). Other columns are matched by their exact text;
//   FillMissing: per continuous column, the training median fills missing cells; a column with missing
//                training cells gets a categorical indicator `<name>_na` ("False" / "True");
//   Normalize:   per continuous column, (x - mean) / (std + 1e-7) with the training mean and population std
//                (after filling).
// A cell is missing when it is one of pandas' default missing markers ("", "NA", "NaN", "null", ...).
#include <fastlearn/data/csv.h>

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace fastlearn {

/// Whether `cell` is one of pandas' default missing-value markers.
bool is_missing_cell(std::string_view cell);

struct TabularProcsOptions {
  std::vector<std::string> cat_names, cont_names;
  /// Any of "categorify", "fill_missing", "normalize" (fastai's default order whatever the order given).
  /// Categorify is needed when there are categorical columns.
  std::vector<std::string> procs = {"categorify", "fill_missing", "normalize"};
};

class TabularProcs {
 public:
  TabularProcs() = default;
  /// Fits on rows `train` of `table`; DataError (naming `origin`, the row and the column) for an absent
  /// column, a continuous cell that is not a number, or a missing one without fill_missing.
  static TabularProcs fit(const CsvTable& table, std::span<const std::int64_t> train,
                          const TabularProcsOptions& options, const std::string& origin);

  /// What encoding does with a category the training rows did not have (or a missing one).
  enum class Unknown {
    na,      ///< it becomes "#na#" (fastai's Categorify)
    refuse,  ///< DataError naming the row, the column and the value (a user or item a model never saw)
  };

  struct Encoded {
    at::Tensor cats;   ///< (N, cat_names().size()) int64 codes
    at::Tensor conts;  ///< (N, cont_names().size()) float32
  };
  /// Rows `rows` of `table` (whose columns may be in any order, with others besides).
  Encoded encode(const CsvTable& table, std::span<const std::int64_t> rows, const std::string& origin,
                 Unknown unknown = Unknown::na) const;
  /// One row given as column name -> cell; an absent column is a missing cell, and a name that is not one of
  /// the columns the procs read is a DataError naming it and the closest one. Errors name `origin` and the
  /// column ("rows.csv:5: column 'age': 'abc' is not a number ...").
  Encoded encode_row(const std::map<std::string, std::string>& row, const std::string& origin = "the row",
                     Unknown unknown = Unknown::na) const;

  /// The codes of `values` in the categorical column `column` (an index into cat_columns()), matched as encode()
  /// matches them ("1" and "1.0" one category in a column of numbers); 0 ("#na#") for a value the training rows lacked.
  std::vector<std::int64_t> category_codes(std::size_t column, std::span<const std::string> values) const;

  /// The table's categorical columns (with cont_names(), the columns a row gives).
  const std::vector<std::string>& cat_columns() const { return cat_columns_; }
  /// The model's categorical inputs: the categorical columns, then the `<cont>_na` indicators.
  const std::vector<std::string>& cat_names() const { return cat_names_; }
  const std::vector<std::string>& cont_names() const { return cont_names_; }
  /// Per categorical input, its vocabulary ("#na#" first).
  const std::vector<std::vector<std::string>>& vocabs() const { return vocabs_; }
  const std::vector<double>& fill_values() const { return fill_; }
  const std::vector<double>& means() const { return means_; }
  const std::vector<double>& stds() const { return stds_; }
  const std::vector<std::string>& procs() const { return procs_; }

  /// As JSON (saved in checkpoints), and back; DataError naming `origin` when the text is not such JSON.
  std::string to_json() const;
  static TabularProcs from_json(std::string_view json, const std::string& origin);
  bool operator==(const TabularProcs&) const = default;

 private:
  // encode(); `one_row`: errors name `origin` and the column only, not a row of the table made for the one row.
  Encoded encode(const CsvTable& table, std::span<const std::int64_t> rows, const std::string& origin, Unknown unknown,
                 bool one_row) const;

  std::vector<std::string> procs_;
  std::vector<std::string> cat_columns_;  // the categorical columns of the data (cat_names_ without _na)
  std::vector<std::string> cat_names_, cont_names_;
  std::vector<std::vector<std::string>> vocabs_;
  std::vector<double> fill_, means_, stds_;
  std::vector<bool> has_na_col_;  // per continuous column
};

/// How a table's rows reach the model, besides the procs (recorded with them in exports).
struct TabularLayout {
  /// fastai's with_cont: false leaves the continuous tensor out of the batches, which then hold the categorical codes
  /// alone (a ratings table's user and item, as collaborative filtering's models take them).
  bool with_cont = true;
  /// Rows to predict (test_dl, predict_row) must hold categories the training rows had: one the model has no trained
  /// embedding for (a user or item it never saw) is a DataError naming the row, instead of becoming "#na#".
  bool known_categories_only = false;
  bool operator==(const TabularLayout&) const = default;
};

}  // namespace fastlearn
