#pragma once
// CSV files through libcsv (RFC 4180: quoted fields, doubled quotes, line breaks inside quotes), read
// strictly: every row must have as many fields as the first, and a malformed file is a DataError that
// names the file and the row (the header is row 1). Fields keep their spaces, as pandas keeps them; a UTF-8
// byte order mark before the header is dropped. The text must be UTF-8 (a field that is not is an error).
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace fastlearn {

struct CsvOptions {
  char delimiter = ',';
  bool header = true;  ///< the first row names the columns
};

struct CsvTable {
  std::vector<std::string> columns;            ///< from the header, or "0", "1", ... without one
  std::vector<std::vector<std::string>> rows;  ///< the data rows, each with columns.size() fields

  /// The index of column `name`; DataError naming `origin` and the columns there are when it is absent.
  std::size_t column(const std::string& name, const std::string& origin) const;
};

/// A cell of a column that marks rows (a valid column), case-insensitive: true, 1 or yes; false, 0, no or empty.
/// nullopt for anything else.
std::optional<bool> csv_flag(std::string_view cell);
/// What csv_flag accepts, for error messages.
inline constexpr std::string_view kCsvFlagValues = "true/false, yes/no or 1/0 (empty: false)";

CsvTable read_csv(const std::filesystem::path& file, const CsvOptions& options = {});
/// The same for CSV text in memory; `origin` names it in errors.
CsvTable parse_csv(std::string_view text, std::string_view origin, const CsvOptions& options = {});

}  // namespace fastlearn
