#pragma once
// TabularDataLoaders (fastai's): the train and valid loaders of a table, from a CSV file or from columns held
// in memory. The split comes from a valid column, explicit row indices, or a seeded valid_pct split (fastai's
// RandomSplitter); the procs (tabular_procs.h) are fitted on the training rows only. Batches hold two inputs,
// the categorical codes (N, cats) int64 and the continuous values (N, conts) float32, and one target: class
// indices (N) int64 for a single categorical target, or (N, targets) float32 for regression. A layout without
// continuous inputs (TabularLayout::with_cont, as collab_dataloaders.h makes) gives the codes alone.
#include <fastlearn/data/dataloaders.h>
#include <fastlearn/data/tabular_procs.h>

#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace fastlearn {

struct TabularOptions {
  std::vector<std::string> y_names;  ///< target column(s)
  std::vector<std::string> cat_names, cont_names;
  std::vector<std::string> procs = {"categorify", "fill_missing", "normalize"};
  /// Default: classification when there is one target and some training value of it is not a number,
  /// regression otherwise (as fastai picks its y_block from the column's type).
  std::optional<bool> regression;
  std::string valid_col;                ///< a column of flags marking validation rows (csv_flag: true/yes/1)
  std::vector<std::int64_t> valid_idx;  ///< else: data rows (0-based, the header not counted) for validation
  double valid_pct = 0.2;               ///< else: this share of rows, drawn by split_seed
  std::uint64_t split_seed = 42;
  std::int64_t bs = 64;
  std::int64_t valid_bs = 0;  ///< 0: twice bs
  int num_workers = 0;
  std::optional<std::uint64_t> seed;  ///< order seed of the training loader
  std::optional<c10::Device> device;
  char delimiter = ',';
  TabularLayout layout;  ///< batches without the continuous tensor; predictions refusing unknown categories
};

/// The rows of a table after the procs; what the loaders of TabularDataLoaders hold.
class TabularDataset : public TensorDataset {
 public:
  /// Items hold (cats, conts), or the cats alone when `layout.with_cont` is false.
  TabularDataset(TabularProcs::Encoded x, at::Tensor y, std::shared_ptr<const TabularProcs> procs,
                 std::vector<std::string> y_names, bool regression, TabularLayout layout = {});
  const TabularProcs& procs() const { return *procs_; }
  std::shared_ptr<const TabularProcs> procs_ptr() const { return procs_; }
  const std::vector<std::string>& y_names() const { return y_names_; }
  bool regression() const { return regression_; }
  const TabularLayout& layout() const { return layout_; }
  /// What predictions do with a category the training rows did not have, as layout().known_categories_only says.
  TabularProcs::Unknown unknown_categories() const {
    return layout_.known_categories_only ? TabularProcs::Unknown::refuse : TabularProcs::Unknown::na;
  }

 private:
  std::shared_ptr<const TabularProcs> procs_;
  std::vector<std::string> y_names_;
  bool regression_;
  TabularLayout layout_;
};

struct TabularDataLoaders {
  /// The CSV file at `path` (libcsv: quoted fields, embedded delimiters and line breaks, a header row).
  static DataLoaders from_csv(const std::filesystem::path& path, const TabularOptions& options);
  /// A table already read; `origin` names it in errors.
  static DataLoaders from_table(const CsvTable& table, const TabularOptions& options, const std::string& origin);
  /// Whether from_table(table, options, origin) makes a regression: options.regression, else its default (read
  /// from the training rows of the split that `options` gives). DataError as from_table for an absent target
  /// column or a bad split.
  static bool regression(const CsvTable& table, const TabularOptions& options, const std::string& origin);
  /// Columns held in memory, name -> cells (all of the same length), as fastai's from_df.
  static DataLoaders from_columns(const std::map<std::string, std::vector<std::string>>& columns,
                                  const TabularOptions& options);
  /// fastai's dls.test_dl for a table: the rows of `table` (its columns in any order, others such as the target
  /// ignored) through `dls`'s fitted procs, in order and without targets, batched as the validation loader, for
  /// Learner::get_preds. Errors name `origin`, the row and the column; DataError when `dls` is not a table's.
  static DataLoader test_dl(const DataLoaders& dls, const CsvTable& table, const std::string& origin);
};

/// The TabularDataset behind `dls` (its training set); nullptr when the data is not tabular.
const TabularDataset* tabular_dataset(const DataLoaders& dls);

}  // namespace fastlearn
