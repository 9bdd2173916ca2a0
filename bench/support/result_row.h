#pragma once
// One benchmark result in bench/run's format (ARCHITECTURE.md "Contracts"): a member "<name>": {"ours", "anchor",
// "ratio", "unit", "higher_is_better", "ours_range", "anchor_range", then the fields the benchmark adds}, with
// ratio > 1 meaning fastlearn is better. A benchmark prints its rows as one line holding one JSON object
// (results_line), which bench/run merges into bench/results/latest.json.
#include <nlohmann/json.hpp>

#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "bench_support.h"

namespace bench {

/// `x` rounded to `decimals` places: the figure as measured, without binary noise in the JSON.
inline double rounded(double x, int decimals) {
  const double scale = std::pow(10.0, decimals);
  return std::isfinite(x) ? std::round(x * scale) / scale : x;
}

class Row {
 public:
  /// `decimals`: those of ours, anchor and their ranges. The ratio (3 decimals) is ours / anchor when higher is
  /// better, anchor / ours otherwise.
  Row(std::string name, const Stats& ours, const Stats& anchor, std::string unit, bool higher_is_better, int decimals)
      : name_(std::move(name)) {
    fields_["ours"] = rounded(ours.median, decimals);
    fields_["anchor"] = rounded(anchor.median, decimals);
    fields_["ratio"] = rounded(higher_is_better ? ours.median / anchor.median : anchor.median / ours.median, 3);
    fields_["unit"] = std::move(unit);
    fields_["higher_is_better"] = higher_is_better;
    fields_["ours_range"] = {rounded(ours.min, decimals), rounded(ours.max, decimals)};
    fields_["anchor_range"] = {rounded(anchor.min, decimals), rounded(anchor.max, decimals)};
  }

  /// A field of the benchmark's own (a count, a flag, a text, a list).
  Row& set(const std::string& key, nlohmann::ordered_json value) {
    fields_[key] = std::move(value);
    return *this;
  }
  /// A measured figure, rounded to `decimals`.
  Row& set(const std::string& key, double value, int decimals) {
    fields_[key] = rounded(value, decimals);
    return *this;
  }
  /// `key` the median of `s`, `key`_range its [min, max], rounded to `decimals`.
  Row& stats(const std::string& key, const Stats& s, int decimals) {
    fields_[key] = rounded(s.median, decimals);
    fields_[key + "_range"] = {rounded(s.min, decimals), rounded(s.max, decimals)};
    return *this;
  }
  /// Another ratio than ours against anchor, where the goal compares something else (the benchmark says what).
  Row& ratio(double value) {
    fields_["ratio"] = rounded(value, 3);
    return *this;
  }

  const std::string& name() const { return name_; }
  const nlohmann::ordered_json& fields() const { return fields_; }

 private:
  std::string name_;
  nlohmann::ordered_json fields_ = nlohmann::ordered_json::object();
};

/// The line bench/run reads: {"<name>": {...}, ...}, the rows in order.
inline std::string results_line(const std::vector<Row>& rows) {
  nlohmann::ordered_json all = nlohmann::ordered_json::object();
  for (const auto& row : rows) all[row.name()] = row.fields();
  return all.dump();
}

}  // namespace bench
