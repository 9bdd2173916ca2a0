#include <fastlearn/data/tabular_dataloaders.h>

#include <fastlearn/core/detail/text.h>
#include <fastlearn/core/error.h>
#include <fastlearn/data/random_splitter.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/torch.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <numeric>
#include <set>

namespace fastlearn {
namespace {

std::optional<double> parse_number(std::string_view cell) {
  while (!cell.empty() && cell.front() == ' ') cell.remove_prefix(1);
  while (!cell.empty() && cell.back() == ' ') cell.remove_suffix(1);
  if (!cell.empty() && cell.front() == '+') cell.remove_prefix(1);
  double value = 0;
  const auto [end, error] = std::from_chars(cell.data(), cell.data() + cell.size(), value);
  if (cell.empty() || error != std::errc() || end != cell.data() + cell.size() || std::isnan(value))
    return std::nullopt;
  return value;
}

// Which rows are for validation: the valid column, else the given indices, else the seeded valid_pct split.
std::vector<bool> valid_rows(const CsvTable& table, const TabularOptions& o, const std::string& origin) {
  const auto n = static_cast<std::int64_t>(table.rows.size());
  if (!o.valid_col.empty()) {
    const auto col = table.column(o.valid_col, origin);
    std::vector<bool> valid;
    for (std::size_t r = 0; r < table.rows.size(); ++r) {
      const auto flag = csv_flag(table.rows[r][col]);
      if (!flag) {
        throw DataError(fmt::format("{}: row {}, column '{}': '{}' is not {}", excerpt(origin, 256), r + 2,
                                    excerpt(o.valid_col), excerpt(table.rows[r][col]), kCsvFlagValues));
      }
      valid.push_back(*flag);
    }
    return valid;
  }
  if (!o.valid_idx.empty()) {
    std::vector<bool> valid(static_cast<std::size_t>(n), false);
    for (auto i : o.valid_idx) {
      if (i < 0 || i >= n)
        throw DataError(fmt::format("{}: valid_idx {} is outside the {} data rows", excerpt(origin, 256), i, n));
      valid[static_cast<std::size_t>(i)] = true;
    }
    return valid;
  }
  return random_valid_mask(n, o.valid_pct, o.split_seed, origin);
}

// Up to 10 of a list, and how many there are when that is not all: "a, b, c" or "a, b, ... (250 classes)".
std::string some_of(const std::vector<std::string>& classes) {
  constexpr std::size_t kShown = 10;
  if (classes.size() <= kShown) return fmt::format("{}", fmt::join(excerpts(classes), ", "));
  const std::vector<std::string> shown(classes.begin(), classes.begin() + kShown);
  return fmt::format("{}, ... ({} classes)", fmt::join(excerpts(shown), ", "), classes.size());
}

// A class missing from the training rows, when every class is a number, most likely means that the target is a
// quantity to regress, not a category: say how to make it one.
std::string regression_hint(const std::vector<std::string>& classes, const std::string& cell) {
  const auto is_number = [](const std::string& v) { return parse_number(v).has_value(); };
  if (!is_number(cell) || !std::all_of(classes.begin(), classes.end(), is_number)) return {};
  return "; the target's values are all numbers: for a regression, set TabularOptions::regression = true "
         "(data.y_block = \"regression\" in a config)";
}

// fastai's choice of y_block when none is given: several targets, or one whose training values are all numbers,
// make a regression; one target with a value that is not a number, a classification.
bool regression_by_default(const CsvTable& table, const TabularOptions& o, const std::vector<std::int64_t>& train,
                           const std::string& origin) {
  if (o.y_names.size() != 1) return o.y_names.size() > 1;
  const auto col = table.column(o.y_names.front(), origin);
  return std::all_of(train.begin(), train.end(), [&](std::int64_t r) {
    return parse_number(table.rows[static_cast<std::size_t>(r)][col]).has_value();
  });
}

std::vector<std::int64_t> training_rows(const std::vector<bool>& is_valid) {
  std::vector<std::int64_t> train;
  for (std::size_t r = 0; r < is_valid.size(); ++r)
    if (!is_valid[r]) train.push_back(static_cast<std::int64_t>(r));
  return train;
}

struct Targets {
  at::Tensor train, valid;
  std::vector<std::string> vocab;  // classification
};

Targets encode_targets(const CsvTable& table, const TabularOptions& o, bool regression,
                       const std::vector<std::int64_t>& train, const std::vector<std::int64_t>& valid,
                       const std::string& origin) {
  std::vector<std::size_t> cols;
  for (const auto& name : o.y_names) cols.push_back(table.column(name, origin));
  Targets t;
  if (regression) {
    auto values = [&](const std::vector<std::int64_t>& rows) {
      auto y =
          torch::empty({static_cast<std::int64_t>(rows.size()), static_cast<std::int64_t>(cols.size())}, torch::kFloat);
      auto* out = y.data_ptr<float>();
      for (std::size_t i = 0; i < rows.size(); ++i) {
        for (std::size_t j = 0; j < cols.size(); ++j) {
          const auto& cell = table.rows[static_cast<std::size_t>(rows[i])][cols[j]];
          const auto x = parse_number(cell);
          if (!x) {
            throw DataError(fmt::format("{}: row {}, target '{}': '{}' is not a number (a regression target)",
                                        excerpt(origin, 256), rows[i] + 2, excerpt(o.y_names[j]), excerpt(cell)));
          }
          out[i * cols.size() + j] = static_cast<float>(*x);
        }
      }
      return y;
    };
    t.train = values(train);
    t.valid = values(valid);
    return t;
  }
  const auto col = cols.front();
  std::set<std::string> classes;
  for (auto r : train) {
    const auto& cell = table.rows[static_cast<std::size_t>(r)][col];
    if (is_missing_cell(cell)) {
      throw DataError(fmt::format("{}: row {}, target '{}': the cell is missing", excerpt(origin, 256), r + 2,
                                  excerpt(o.y_names.front())));
    }
    classes.insert(cell);
  }
  t.vocab.assign(classes.begin(), classes.end());
  std::map<std::string_view, std::int64_t> index;
  for (std::size_t k = 0; k < t.vocab.size(); ++k) index.emplace(t.vocab[k], static_cast<std::int64_t>(k));
  auto codes = [&](const std::vector<std::int64_t>& rows) {
    auto y = torch::empty({static_cast<std::int64_t>(rows.size())}, torch::kLong);
    auto* out = y.data_ptr<std::int64_t>();
    for (std::size_t i = 0; i < rows.size(); ++i) {
      const auto& cell = table.rows[static_cast<std::size_t>(rows[i])][col];
      const auto it = index.find(cell);
      if (it == index.end()) {
        throw DataError(fmt::format(
            "{}: row {}, target '{}': class '{}' is not among the training rows' classes ({}){}", excerpt(origin, 256),
            rows[i] + 2, excerpt(o.y_names.front()), excerpt(cell), some_of(t.vocab), regression_hint(t.vocab, cell)));
      }
      out[i] = it->second;
    }
    return y;
  };
  t.train = codes(train);
  t.valid = codes(valid);
  return t;
}

}  // namespace

TabularDataset::TabularDataset(TabularProcs::Encoded x, at::Tensor y, std::shared_ptr<const TabularProcs> procs,
                               std::vector<std::string> y_names, bool regression, TabularLayout layout)
    : TensorDataset(layout.with_cont ? std::vector<at::Tensor>{std::move(x.cats), std::move(x.conts)}
                                     : std::vector<at::Tensor>{std::move(x.cats)},
                    y.defined() ? std::vector<at::Tensor>{std::move(y)} : std::vector<at::Tensor>{}),
      procs_(std::move(procs)),
      y_names_(std::move(y_names)),
      regression_(regression),
      layout_(layout) {}

DataLoaders TabularDataLoaders::from_csv(const std::filesystem::path& path, const TabularOptions& options) {
  return from_table(read_csv(path, {.delimiter = options.delimiter}), options, path.string());
}

DataLoaders TabularDataLoaders::from_table(const CsvTable& table, const TabularOptions& o, const std::string& origin) {
  if (o.y_names.empty()) throw ConfigError(fmt::format("{}: no target column given (y_names)", excerpt(origin, 256)));
  if (o.cat_names.empty() && o.cont_names.empty()) {
    throw ConfigError(fmt::format("{}: no input column given (cat_names, cont_names)", excerpt(origin, 256)));
  }
  for (const auto& y : o.y_names) {
    for (const auto& names : {o.cat_names, o.cont_names}) {
      if (std::find(names.begin(), names.end(), y) != names.end()) {
        throw ConfigError(
            fmt::format("{}: column '{}' is both a target and an input", excerpt(origin, 256), excerpt(y)));
      }
    }
  }
  const auto is_valid = valid_rows(table, o, origin);
  std::vector<std::int64_t> train, valid;
  for (std::size_t r = 0; r < is_valid.size(); ++r)
    (is_valid[r] ? valid : train).push_back(static_cast<std::int64_t>(r));
  if (train.empty() || valid.empty()) {
    throw DataError(fmt::format("{}: the split leaves {} training and {} validation rows; both need some",
                                excerpt(origin, 256), train.size(), valid.size()));
  }
  const bool regression = o.regression ? *o.regression : regression_by_default(table, o, train, origin);
  if (!regression && o.y_names.size() > 1) {
    throw ConfigError(fmt::format("{}: {} targets ({}) make a regression; one categorical target at most",
                                  excerpt(origin, 256), o.y_names.size(), fmt::join(excerpts(o.y_names), ", ")));
  }
  auto procs = std::make_shared<const TabularProcs>(TabularProcs::fit(
      table, train, {.cat_names = o.cat_names, .cont_names = o.cont_names, .procs = o.procs}, origin));
  auto y = encode_targets(table, o, regression, train, valid, origin);
  auto train_ds = std::make_shared<TabularDataset>(procs->encode(table, train, origin), y.train, procs, o.y_names,
                                                   regression, o.layout);
  auto valid_ds = std::make_shared<TabularDataset>(procs->encode(table, valid, origin), y.valid, procs, o.y_names,
                                                   regression, o.layout);
  DataLoader train_dl(train_ds, {.bs = o.bs,
                                 .shuffle = true,
                                 .drop_last = true,
                                 .num_workers = o.num_workers,
                                 .seed = o.seed,
                                 .device = o.device});
  DataLoader valid_dl(valid_ds,
                      {.bs = o.valid_bs > 0 ? o.valid_bs : 2 * o.bs, .num_workers = o.num_workers, .device = o.device});
  if (regression)
    return DataLoaders(std::move(train_dl), std::move(valid_dl), static_cast<std::int64_t>(o.y_names.size()));
  return DataLoaders(std::move(train_dl), std::move(valid_dl), std::move(y.vocab));
}

bool TabularDataLoaders::regression(const CsvTable& table, const TabularOptions& options, const std::string& origin) {
  if (options.regression) return *options.regression;
  if (options.y_names.size() != 1) return options.y_names.size() > 1;
  return regression_by_default(table, options, training_rows(valid_rows(table, options, origin)), origin);
}

DataLoaders TabularDataLoaders::from_columns(const std::map<std::string, std::vector<std::string>>& columns,
                                             const TabularOptions& options) {
  CsvTable table;
  std::size_t n = 0;
  for (const auto& [name, cells] : columns) {
    if (!table.columns.empty() && cells.size() != n) {
      throw DataError(fmt::format("TabularDataLoaders::from_columns: column '{}' has {} cells, '{}' has {}",
                                  excerpt(name), cells.size(), excerpt(table.columns.front()), n));
    }
    n = cells.size();
    table.columns.push_back(name);
  }
  table.rows.assign(n, {});
  for (const auto& [name, cells] : columns) {
    for (std::size_t r = 0; r < n; ++r) table.rows[r].push_back(cells[r]);
  }
  return from_table(table, options, "TabularDataLoaders::from_columns");
}

const TabularDataset* tabular_dataset(const DataLoaders& dls) {
  return dynamic_cast<const TabularDataset*>(&dls.train().dataset());
}

DataLoader TabularDataLoaders::test_dl(const DataLoaders& dls, const CsvTable& table, const std::string& origin) {
  const auto* trained = tabular_dataset(dls);
  if (trained == nullptr)
    throw DataError("test_dl: the data is not a table (TabularDataLoaders::from_csv and the like make one)");
  if (table.rows.empty()) throw DataError(fmt::format("{}: no rows to predict", excerpt(origin, 256)));
  std::vector<std::int64_t> rows(table.rows.size());
  std::iota(rows.begin(), rows.end(), std::int64_t{0});
  auto items = std::make_shared<TabularDataset>(
      trained->procs().encode(table, rows, origin, trained->unknown_categories()), at::Tensor(), trained->procs_ptr(),
      trained->y_names(), trained->regression(), trained->layout());
  auto options = dls.valid().options();
  options.shuffle = false;
  options.drop_last = false;
  return DataLoader(std::move(items), std::move(options));
}

}  // namespace fastlearn
