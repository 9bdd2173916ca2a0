// libFuzzer target: parse_csv on arbitrary bytes (comma and semicolon delimited), then, when the table has two
// columns or more, the tabular procs fitted on it (first column categorical, second continuous) and applied
// to it. Any input must give a table whose rows all have the header's width and codes inside each vocabulary,
// with procs that survive their JSON round trip; or a fastlearn::DataError / ConfigError. A crash, a
// sanitizer report, a leak or another exception type is a bug.
#include <fastlearn/core/error.h>
#include <fastlearn/data/csv.h>
#include <fastlearn/data/tabular_procs.h>

#include <torch/torch.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <numeric>
#include <string_view>
#include <vector>

namespace {

void check_procs(const fastlearn::CsvTable& table) {
  std::vector<std::int64_t> rows(table.rows.size());
  std::iota(rows.begin(), rows.end(), 0);
  const auto procs = fastlearn::TabularProcs::fit(
      table, rows, {.cat_names = {table.columns[0]}, .cont_names = {table.columns[1]}}, "fuzz");
  const auto x = procs.encode(table, rows, "fuzz");
  const auto n = static_cast<std::int64_t>(rows.size());
  if (x.cats.size(0) != n || x.conts.size(0) != n) std::abort();
  for (std::int64_t j = 0; j < x.cats.size(1); ++j) {
    const auto codes = x.cats.select(1, j);
    const auto vocab = static_cast<std::int64_t>(procs.vocabs()[static_cast<std::size_t>(j)].size());
    if (codes.min().item<std::int64_t>() < 0 || codes.max().item<std::int64_t>() >= vocab) std::abort();
  }
  if (!torch::isfinite(x.conts).all().item<bool>()) std::abort();
  if (!(fastlearn::TabularProcs::from_json(procs.to_json(), "fuzz") == procs)) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  for (char delimiter : {',', ';'}) {
    try {
      const auto table = fastlearn::parse_csv(text, "fuzz", {.delimiter = delimiter});
      for (const auto& row : table.rows) {
        if (row.size() != table.columns.size()) std::abort();
      }
      if (table.columns.size() >= 2 && !table.rows.empty()) check_procs(table);
    } catch (const fastlearn::DataError&) {
    } catch (const fastlearn::ConfigError&) {}
  }
  return 0;
}
