#include <fastlearn/data/collab_dataloaders.h>

#include <fastlearn/core/detail/text.h>
#include <fastlearn/core/error.h>
#include <fastlearn/data/csv.h>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/torch.h>

namespace fastlearn {

namespace {

// The column named `given`, or the one at `position` (fastai's default: user, item, rating in that order).
std::string column_of(const CsvTable& table, const std::string& given, std::size_t position, const char* role,
                      const std::string& origin) {
  if (!given.empty()) {
    table.column(given, origin);  // DataError naming the columns there are
    return given;
  }
  if (position >= table.columns.size())
    throw DataError(fmt::format(
        "{}: no {} column given, and the table has {} column(s) ({}), not the {} that the "
        "defaults read (user, item, rating)",
        excerpt(origin, 256), role, table.columns.size(), fmt::join(excerpts(table.columns), ", "), position + 1));
  return table.columns[position];
}

}  // namespace

DataLoaders CollabDataLoaders::from_csv(const std::filesystem::path& path, const CollabOptions& options) {
  return from_table(read_csv(path, {.delimiter = options.delimiter}), options, path.string());
}

DataLoaders CollabDataLoaders::from_table(const CsvTable& table, const CollabOptions& o, const std::string& origin) {
  const auto user = column_of(table, o.user, 0, "user", origin);
  const auto item = column_of(table, o.item, 1, "item", origin);
  const auto rating = column_of(table, o.rating, 2, "rating", origin);
  if (user == item || user == rating || item == rating)
    throw ConfigError(fmt::format("{}: the user, item and rating columns must differ ('{}', '{}', '{}')",
                                  excerpt(origin, 256), excerpt(user), excerpt(item), excerpt(rating)));
  if (table.rows.empty())
    throw DataError(fmt::format("{}: the table has no ratings (no data rows)", excerpt(origin, 256)));
  // A rating without its user or item is a broken row, not a category of its own.
  for (const auto& name : {user, item}) {
    const auto col = table.column(name, origin);
    for (std::size_t r = 0; r < table.rows.size(); ++r)
      if (is_missing_cell(table.rows[r][col]))
        throw DataError(
            fmt::format("{}: row {}, column '{}': the cell is missing ('{}'): every rating needs its "
                        "user and item",
                        excerpt(origin, 256), r + 2, excerpt(name), excerpt(table.rows[r][col])));
  }
  return TabularDataLoaders::from_table(table,
                                        {.y_names = {rating},
                                         .cat_names = {user, item},
                                         .procs = {"categorify"},
                                         .regression = true,
                                         .valid_pct = o.valid_pct,
                                         .split_seed = o.seed,
                                         .bs = o.bs,
                                         .valid_bs = o.valid_bs,
                                         .num_workers = o.num_workers,
                                         .seed = o.shuffle_seed,
                                         .device = o.device,
                                         .delimiter = o.delimiter,
                                         .layout = {.with_cont = false, .known_categories_only = true}},
                                        origin);
}

std::optional<CollabClasses> collab_classes(const DataLoaders& dls) {
  const auto* table = tabular_dataset(dls);
  if (table == nullptr || table->layout().with_cont || table->procs().cat_columns().size() != 2 ||
      !table->procs().cont_names().empty() || table->y_names().size() != 1)
    return std::nullopt;
  const auto& procs = table->procs();
  return CollabClasses{.user = procs.cat_columns()[0],
                       .item = procs.cat_columns()[1],
                       .rating = table->y_names()[0],
                       .users = procs.vocabs()[0],
                       .items = procs.vocabs()[1]};
}

at::Tensor collab_codes(const DataLoaders& dls, const std::vector<std::string>& ids, bool is_item, bool known_only,
                        std::string_view who) {
  const auto* table = tabular_dataset(dls);
  if (table == nullptr || !collab_classes(dls))
    throw ConfigError(fmt::format("{}: the data is not a table of ratings (make it with CollabDataLoaders)", who));
  const auto& procs = table->procs();
  const std::size_t column = is_item ? 1 : 0;
  auto codes = procs.category_codes(column, ids);
  for (std::size_t i = 0; known_only && i < codes.size(); ++i)
    if (codes[i] == 0)
      throw DataError(
          fmt::format("{}: {} '{}' is not one of the {} the training rows have: the model has no embedding for it", who,
                      excerpt(procs.cat_columns()[column]), excerpt(ids[i]), procs.vocabs()[column].size() - 1));
  return torch::tensor(codes, torch::kLong);
}

}  // namespace fastlearn
