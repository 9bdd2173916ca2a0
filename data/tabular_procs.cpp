#include <fastlearn/data/tabular_procs.h>

#include <fastlearn/core/detail/suggest.h>
#include <fastlearn/core/detail/text.h>
#include <fastlearn/core/error.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/torch.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <charconv>
#include <cmath>
#include <optional>
#include <set>

namespace fastlearn {
namespace {

constexpr const char* kNa = "#na#";
constexpr double kStdEps = 1e-7;  // fastai's Normalize adds it to the std

// The cell as a number (a leading '+' and surrounding spaces allowed, as pandas reads numbers); nullopt if it is not
// one.
std::optional<double> number(std::string_view cell) {
  while (!cell.empty() && cell.front() == ' ') cell.remove_prefix(1);
  while (!cell.empty() && cell.back() == ' ') cell.remove_suffix(1);
  if (!cell.empty() && cell.front() == '+') cell.remove_prefix(1);
  if (cell.empty()) return std::nullopt;
  double value = 0;
  const auto [end, error] = std::from_chars(cell.data(), cell.data() + cell.size(), value);
  if (error != std::errc() || end != cell.data() + cell.size()) return std::nullopt;
  return value;
}

// Whether every value is a number (NaN is not one): such a categorical column is sorted and matched by number, as
// pandas reads it as a numeric column ("1" and "1.0" are one category, as fastai sees them).
bool all_numbers(std::span<const std::string> values) {
  return std::all_of(values.begin(), values.end(), [](const std::string& v) {
    const auto x = number(v);
    return x && !std::isnan(*x);
  });
}

// Whether a categorical column's values are matched by number: all numbers, each exactly one double. Integers past
// 2^53 (17-digit and longer IDs) are not: distinct ones would round to one double, and pandas reads such a column as
// exact int64, so they are matched by their text.
bool matches_by_number(std::span<const std::string> values) {
  constexpr double kExactIntegers = 9007199254740992.0;  // 2^53
  return all_numbers(values) && std::all_of(values.begin(), values.end(), [&](const std::string& v) {
           return std::abs(*number(v)) < kExactIntegers;
         });
}

// Sorted as pandas sorts a column: numerically when every value is a number, else as text (code points).
void sort_values(std::vector<std::string>& values) {
  if (!all_numbers(values)) return std::sort(values.begin(), values.end());
  std::vector<std::pair<double, std::string>> numbers;
  for (const auto& v : values) numbers.emplace_back(*number(v), v);
  std::sort(numbers.begin(), numbers.end());
  for (std::size_t i = 0; i < values.size(); ++i) values[i] = numbers[i].second;
}

// The distinct present cells of a categorical column's training rows. When they match by number, cells of the same
// number are one category, spelled as the first training row that has it spells it ("1.0" and "1" are one).
std::vector<std::string> categories(const CsvTable& table, std::size_t col, std::span<const std::int64_t> rows) {
  std::vector<std::string> values;
  std::set<std::string_view> seen;
  for (auto r : rows) {
    const auto& cell = table.rows[static_cast<std::size_t>(r)][col];
    if (!is_missing_cell(cell) && seen.insert(cell).second) values.push_back(cell);
  }
  if (!matches_by_number(values)) return values;
  std::vector<std::string> distinct;
  std::set<double> numbers;
  for (auto& v : values)
    if (numbers.insert(*number(v)).second) distinct.push_back(std::move(v));
  return distinct;
}

// A categorical column's codes: by the cell's text; for a vocabulary of numbers, else by the cell's number. What
// matches neither (or is missing) is #na#, 0. The text comes first so that a vocabulary fitted before cells were
// matched by number (which may hold both "1" and "1.0") codes its cells as it did.
class CategoryCodes {
 public:
  explicit CategoryCodes(const std::vector<std::string>& vocab) {
    const std::span<const std::string> values(vocab.data() + std::min<std::size_t>(1, vocab.size()),
                                              vocab.size() - std::min<std::size_t>(1, vocab.size()));
    const bool numeric = matches_by_number(values);
    for (std::size_t k = 1; k < vocab.size(); ++k) {
      by_text_.emplace(vocab[k], static_cast<std::int64_t>(k));
      if (numeric) by_number_.emplace(*number(vocab[k]), static_cast<std::int64_t>(k));
    }
  }
  std::int64_t operator()(std::string_view cell) const {
    if (const auto it = by_text_.find(cell); it != by_text_.end()) return it->second;
    if (by_number_.empty()) return 0;
    const auto x = number(cell);
    if (!x || std::isnan(*x)) return 0;
    const auto it = by_number_.find(*x);
    return it == by_number_.end() ? 0 : it->second;
  }

 private:
  std::map<std::string_view, std::int64_t> by_text_;
  std::map<double, std::int64_t> by_number_;  // -0 and 0 are one key
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const auto n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

bool has(const std::vector<std::string>& procs, std::string_view name) {
  return std::find(procs.begin(), procs.end(), name) != procs.end();
}

}  // namespace

bool is_missing_cell(std::string_view cell) {
  // pandas' read_csv default na_values.
  static const std::set<std::string_view> kMarkers{"",     "#N/A",   "#N/A N/A", "#NA",  "-1.#IND", "-1.#QNAN", "-NaN",
                                                   "-nan", "1.#IND", "1.#QNAN",  "<NA>", "N/A",     "NA",       "NULL",
                                                   "NaN",  "None",   "n/a",      "nan",  "null"};
  return kMarkers.count(cell) > 0;
}

TabularProcs TabularProcs::fit(const CsvTable& table, std::span<const std::int64_t> train,
                               const TabularProcsOptions& options, const std::string& origin) {
  static const std::array<std::string, 3> kOrder{"categorify", "fill_missing", "normalize"};
  for (const auto& p : options.procs) {
    if (std::find(kOrder.begin(), kOrder.end(), p) == kOrder.end()) {
      throw ConfigError(fmt::format("{}: unknown tabular proc '{}'; the procs are {}", excerpt(origin, 256), excerpt(p),
                                    fmt::join(kOrder, ", ")));
    }
  }
  TabularProcs t;
  for (const auto& p : kOrder)
    if (has(options.procs, p)) t.procs_.push_back(p);
  if (!options.cat_names.empty() && !has(t.procs_, "categorify")) {
    throw ConfigError(fmt::format("{}: categorical columns ({}) need the categorify proc", excerpt(origin, 256),
                                  fmt::join(excerpts(options.cat_names), ", ")));
  }
  if (train.empty())
    throw DataError(fmt::format("{}: no training rows to fit the tabular procs on", excerpt(origin, 256)));
  std::set<std::string> seen;
  for (const auto& name : options.cat_names)
    if (!seen.insert(name).second)
      throw ConfigError(fmt::format("{}: column '{}' is named twice", excerpt(origin, 256), excerpt(name)));
  for (const auto& name : options.cont_names)
    if (!seen.insert(name).second)
      throw ConfigError(fmt::format("{}: column '{}' is named twice", excerpt(origin, 256), excerpt(name)));

  t.cat_columns_ = options.cat_names;
  t.cat_names_ = options.cat_names;
  t.cont_names_ = options.cont_names;
  for (const auto& name : options.cat_names) {
    auto vocab = categories(table, table.column(name, origin), train);
    sort_values(vocab);
    vocab.insert(vocab.begin(), kNa);
    t.vocabs_.push_back(std::move(vocab));
  }
  const bool fill = has(t.procs_, "fill_missing");
  std::vector<std::vector<double>> train_values;
  for (const auto& name : options.cont_names) {
    const auto col = table.column(name, origin);
    std::vector<double> present;
    bool missing = false;
    for (auto r : train) {
      const auto& cell = table.rows[static_cast<std::size_t>(r)][col];
      const auto x = number(cell);
      if (x && std::isinf(*x)) {
        throw DataError(fmt::format("{}: row {}, column '{}': '{}' is not a finite number", excerpt(origin, 256), r + 2,
                                    excerpt(name), excerpt(cell)));
      }
      if (x && !std::isnan(*x)) {
        present.push_back(*x);
      } else if (is_missing_cell(cell) || (x && std::isnan(*x))) {
        if (!fill) {
          throw DataError(fmt::format("{}: row {}, column '{}': a missing value, and the procs have no fill_missing",
                                      excerpt(origin, 256), r + 2, excerpt(name)));
        }
        missing = true;
      } else {
        throw DataError(fmt::format("{}: row {}, column '{}': '{}' is not a number (a continuous column)",
                                    excerpt(origin, 256), r + 2, excerpt(name), excerpt(cell)));
      }
    }
    if (present.empty() && fill) {
      throw DataError(fmt::format("{}: column '{}' has no value in the training rows to fill with",
                                  excerpt(origin, 256), excerpt(name)));
    }
    t.fill_.push_back(present.empty() ? 0.0 : median(present));
    t.has_na_col_.push_back(missing);
    if (missing) {
      t.cat_names_.push_back(name + "_na");
      t.vocabs_.push_back({kNa, "False", "True"});
    }
    // What Normalize sees: the filled training column.
    if (missing) present.insert(present.end(), train.size() - present.size(), t.fill_.back());
    train_values.push_back(std::move(present));
  }
  for (const auto& v : train_values) {
    if (!has(t.procs_, "normalize")) {
      t.means_.push_back(0.0);
      t.stds_.push_back(1.0 - kStdEps);  // (x - 0) / (std + eps) is then x
      continue;
    }
    double sum = 0;
    for (double x : v) sum += x;
    const double mean = sum / static_cast<double>(v.size());
    double squares = 0;
    for (double x : v) squares += (x - mean) * (x - mean);
    t.means_.push_back(mean);
    t.stds_.push_back(std::sqrt(squares / static_cast<double>(v.size())));
  }
  for (std::size_t j = 0; j < t.cont_names_.size(); ++j) {
    if (!std::isfinite(t.means_[j]) || !std::isfinite(t.stds_[j]) || !std::isfinite(t.fill_[j])) {
      throw DataError(fmt::format("{}: column '{}': its values are too large for double precision statistics",
                                  excerpt(origin, 256), excerpt(t.cont_names_[j])));
    }
  }
  return t;
}

TabularProcs::Encoded TabularProcs::encode(const CsvTable& table, std::span<const std::int64_t> rows,
                                           const std::string& origin, Unknown unknown) const {
  return encode(table, rows, origin, unknown, /*one_row=*/false);
}

TabularProcs::Encoded TabularProcs::encode(const CsvTable& table, std::span<const std::int64_t> rows,
                                           const std::string& origin, Unknown unknown, bool one_row) const {
  // Where a cell is, in errors: "t.csv: row 3, column 'x'" (the header is row 1), or "<origin>: column 'x'" for a
  // row given alone, which has no row number of its own.
  const auto cell_at = [&](std::int64_t r, const std::string& name) {
    return one_row ? fmt::format("{}: column '{}'", excerpt(origin, 256), excerpt(name))
                   : fmt::format("{}: row {}, column '{}'", excerpt(origin, 256), r + 2, excerpt(name));
  };
  const auto n = static_cast<std::int64_t>(rows.size());
  const auto n_cat = static_cast<std::int64_t>(cat_names_.size()),
             n_cont = static_cast<std::int64_t>(cont_names_.size());
  auto cats = torch::zeros({n, n_cat}, torch::kLong);
  auto conts = torch::zeros({n, n_cont}, torch::kFloat);
  auto* c = cats.data_ptr<std::int64_t>();
  auto* x = conts.data_ptr<float>();
  // Category codes by value, one lookup per column.
  for (std::size_t j = 0; j < cat_columns_.size(); ++j) {
    const auto col = table.column(cat_columns_[j], origin);
    const CategoryCodes code(vocabs_[j]);
    for (std::int64_t i = 0; i < n; ++i) {
      const auto& cell = table.rows[static_cast<std::size_t>(rows[static_cast<std::size_t>(i)])][col];
      const auto k = code(cell);  // unknown or missing: #na#
      if (k == 0 && unknown == Unknown::refuse) {
        const auto r = rows[static_cast<std::size_t>(i)];
        throw DataError(
            fmt::format("{}: {} is not among the {} values of the training rows: the model has no embedding for it",
                        cell_at(r, cat_columns_[j]),
                        is_missing_cell(cell) ? "a missing value" : "'" + excerpt(cell) + "'", vocabs_[j].size() - 1));
      }
      c[i * n_cat + static_cast<std::int64_t>(j)] = k;
    }
  }
  std::size_t na_col = cat_columns_.size();
  for (std::size_t j = 0; j < cont_names_.size(); ++j) {
    const auto col = table.column(cont_names_[j], origin);
    const double scale = 1.0 / (stds_[j] + kStdEps);
    for (std::int64_t i = 0; i < n; ++i) {
      const auto r = rows[static_cast<std::size_t>(i)];
      const auto& cell = table.rows[static_cast<std::size_t>(r)][col];
      auto value = number(cell);
      if (value && std::isinf(*value)) {
        throw DataError(fmt::format("{}: '{}' is not a finite number", cell_at(r, cont_names_[j]), excerpt(cell)));
      }
      const bool missing = !value || std::isnan(*value);
      if (missing && !is_missing_cell(cell) && !value) {
        throw DataError(
            fmt::format("{}: '{}' is not a number (a continuous column)", cell_at(r, cont_names_[j]), excerpt(cell)));
      }
      if (missing && !has(procs_, "fill_missing")) {
        throw DataError(
            fmt::format("{}: a missing value, and the procs have no fill_missing", cell_at(r, cont_names_[j])));
      }
      const double v = missing ? fill_[j] : *value;
      x[i * n_cont + static_cast<std::int64_t>(j)] = static_cast<float>((v - means_[j]) * scale);
      if (has_na_col_[j]) c[i * n_cat + static_cast<std::int64_t>(na_col)] = missing ? 2 : 1;
    }
    if (has_na_col_[j]) ++na_col;
  }
  return {cats, conts};
}

std::vector<std::int64_t> TabularProcs::category_codes(std::size_t column, std::span<const std::string> values) const {
  const CategoryCodes code(vocabs_.at(column));
  std::vector<std::int64_t> out;
  out.reserve(values.size());
  for (const auto& value : values) out.push_back(code(value));
  return out;
}

TabularProcs::Encoded TabularProcs::encode_row(const std::map<std::string, std::string>& row, const std::string& origin,
                                               Unknown unknown) const {
  // A name the procs do not read is a typo far more often than a column to leave out on purpose; unchecked, it would
  // make its column a missing cell without a word.
  std::vector<std::string> known(cat_columns_);
  known.insert(known.end(), cont_names_.begin(), cont_names_.end());
  std::vector<std::string> not_read;
  for (const auto& [name, cell] : row) {
    if (std::find(known.begin(), known.end(), name) == known.end())
      not_read.push_back(fmt::format("'{}' (did you mean '{}'?)", excerpt(name), excerpt(closest(name, known))));
  }
  if (!not_read.empty()) {
    throw DataError(fmt::format("{}: no input column {}; the inputs are {}", excerpt(origin, 256),
                                fmt::join(not_read, ", "), fmt::join(excerpts(known), ", ")));
  }
  CsvTable table;
  table.rows.emplace_back();
  for (const auto& names : {cat_columns_, cont_names_}) {
    for (const auto& name : names) {
      table.columns.push_back(name);
      const auto it = row.find(name);
      table.rows.back().push_back(it == row.end() ? std::string() : it->second);
    }
  }
  const std::int64_t first[] = {0};
  return encode(table, first, origin, unknown, /*one_row=*/true);
}

std::string TabularProcs::to_json() const {
  nlohmann::json j;
  j["procs"] = procs_;
  j["cat_columns"] = cat_columns_;
  j["cat_names"] = cat_names_;
  j["cont_names"] = cont_names_;
  j["vocabs"] = vocabs_;
  j["fill_values"] = fill_;
  j["means"] = means_;
  j["stds"] = stds_;
  j["na_columns"] = has_na_col_;
  return j.dump();
}

TabularProcs TabularProcs::from_json(std::string_view json, const std::string& origin) {
  try {
    const auto j = nlohmann::json::parse(json);
    TabularProcs t;
    j.at("procs").get_to(t.procs_);
    j.at("cat_columns").get_to(t.cat_columns_);
    j.at("cat_names").get_to(t.cat_names_);
    j.at("cont_names").get_to(t.cont_names_);
    j.at("vocabs").get_to(t.vocabs_);
    j.at("fill_values").get_to(t.fill_);
    j.at("means").get_to(t.means_);
    j.at("stds").get_to(t.stds_);
    j.at("na_columns").get_to(t.has_na_col_);
    const auto n_cont = t.cont_names_.size();
    const auto n_na = static_cast<std::size_t>(std::count(t.has_na_col_.begin(), t.has_na_col_.end(), true));
    if (t.fill_.size() != n_cont || t.means_.size() != n_cont || t.stds_.size() != n_cont ||
        t.has_na_col_.size() != n_cont || t.cat_names_.size() != t.cat_columns_.size() + n_na ||
        t.vocabs_.size() != t.cat_names_.size()) {
      throw DataError("the sizes of its parts do not agree");
    }
    return t;
  } catch (const nlohmann::json::exception& e) {
    throw DataError(fmt::format("{}: the tabular procs are not valid JSON of TabularProcs: {}", excerpt(origin, 256),
                                excerpt(e.what(), 256)));
  } catch (const DataError& e) {
    throw DataError(fmt::format("{}: the tabular procs are inconsistent: {}", excerpt(origin, 256), e.what()));
  }
}

}  // namespace fastlearn
