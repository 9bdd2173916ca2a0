#pragma once
// fastai's CollabDataLoaders: a table of ratings (a user, an item, a rating per row) made into the loaders of
// collaborative filtering. The users and items are two categorical columns through fastai's Categorify alone
// ("#na#" first, then the training rows' values sorted, numerically when they are numbers; a user or item first
// seen in the validation rows is "#na#" there, as in fastai), the ratings a float target (N, 1), the split fastai's
// RandomSplitter(valid_pct, seed). Batches hold the codes alone, (N, 2) int64: the user's, then the item's
// (TabularLayout::with_cont = false, as fastai's TabularCollab). Predictions (test_dl, predict_row) refuse, by row, a
// user or item the training rows did not have: the model has no trained embedding for it.
#include <fastlearn/data/dataloaders.h>
#include <fastlearn/data/tabular_dataloaders.h>

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

namespace fastlearn {

struct CollabOptions {
  std::string user;    ///< the users' column (empty: the first), fastai's user_name
  std::string item;    ///< the items' column (empty: the second)
  std::string rating;  ///< the ratings' column (empty: the third)
  double valid_pct = 0.2;
  std::uint64_t seed = 42;  ///< the split's (fastai's from_df seed)
  std::int64_t bs = 64;
  std::int64_t valid_bs = 0;  ///< 0: twice bs
  int num_workers = 0;
  std::optional<std::uint64_t> shuffle_seed;  ///< order seed of the training loader
  std::optional<c10::Device> device;
  char delimiter = ',';
};

struct CollabDataLoaders {
  /// The CSV file at `path` (a header row). DataError naming the file and the row for an absent column, a user or
  /// item cell that is missing, a rating that is not a number, or a table without rows.
  static DataLoaders from_csv(const std::filesystem::path& path, const CollabOptions& options = {});
  /// A table already read; `origin` names it in errors.
  static DataLoaders from_table(const CsvTable& table, const CollabOptions& options, const std::string& origin);
};

/// The columns and vocabularies of a ratings table's loaders (CollabDataLoaders, or an export's).
struct CollabClasses {
  std::string user, item, rating;  ///< the column names
  std::vector<std::string> users;  ///< the users' vocabulary, "#na#" first (fastai's dls.classes[user])
  std::vector<std::string> items;  ///< the items'
};
/// The classes of `dls`; nullopt when its data is not a ratings table.
std::optional<CollabClasses> collab_classes(const DataLoaders& dls);

/// The codes (int64) of `ids` among the items' vocabulary of `dls` (the users' when `is_item` is false), matched as its
/// Categorify matches them. With `known_only`, an id the training rows lacked is a DataError naming `who`, the column
/// and the id ("predict_rating: user '7' is not one of the 943 the training rows have ..."); without, its code is 0.
/// ConfigError when `dls` is not a ratings table's.
at::Tensor collab_codes(const DataLoaders& dls, const std::vector<std::string>& ids, bool is_item, bool known_only,
                        std::string_view who);

}  // namespace fastlearn
