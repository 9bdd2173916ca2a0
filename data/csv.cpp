#include <fastlearn/data/csv.h>

#include <csv.h>
#include <fastlearn/core/detail/text.h>
#include <fastlearn/core/error.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cctype>
#include <fstream>
#include <memory>

namespace fastlearn {
namespace {

struct Reader {
  CsvTable table;
  std::vector<std::string> row;
  std::size_t rows_seen = 0;
  std::size_t line = 1;  // where the current row starts (quoted fields may hold line breaks)
  std::string error;     // the first row whose width differs (callbacks cannot throw through C)
  std::string origin;
  bool header = true;

  // "row 3" or, when quoted line breaks put it elsewhere, "row 3 (line 5)".
  std::string where() const {
    return line == rows_seen ? fmt::format("row {}", rows_seen) : fmt::format("row {} (line {})", rows_seen, line);
  }

  void end_row() {
    ++rows_seen;
    std::size_t breaks = 0;  // counted before the row is moved into the table
    for (const auto& field : row) breaks += static_cast<std::size_t>(std::count(field.begin(), field.end(), '\n'));
    for (std::size_t k = 0; k < row.size() && error.empty(); ++k) {
      if (const auto at = invalid_utf8_at(row[k])) {
        error = fmt::format(
            "{}: {}, field {} ('{}') is not UTF-8 text (byte 0x{:02X} at offset {}; CSV files are read as UTF-8, as "
            "pandas reads them; convert it first, e.g. iconv -f latin1 -t utf-8)",
            excerpt(origin, 256), where(), k + 1, excerpt(row[k]), static_cast<unsigned char>(row[k][*at]), *at);
      }
    }
    if (rows_seen == 1) {
      if (header) {
        table.columns = std::move(row);
      } else {
        for (std::size_t i = 0; i < row.size(); ++i) table.columns.push_back(std::to_string(i));
        table.rows.push_back(std::move(row));
      }
    } else if (row.size() != table.columns.size()) {
      if (error.empty()) {
        error = fmt::format("{}: {} has {} field(s), the first row has {}", excerpt(origin, 256), where(), row.size(),
                            table.columns.size());
      }
    } else {
      table.rows.push_back(std::move(row));
    }
    line += 1 + breaks;
    row.clear();
  }
};

void on_field(void* data, std::size_t size, void* reader) {
  static_cast<Reader*>(reader)->row.emplace_back(static_cast<const char*>(data), size);
}
void on_row(int, void* reader) { static_cast<Reader*>(reader)->end_row(); }

}  // namespace

std::size_t CsvTable::column(const std::string& name, const std::string& origin) const {
  for (std::size_t i = 0; i < columns.size(); ++i) {
    if (columns[i] == name) return i;
  }
  throw DataError(fmt::format("{}: no column '{}'; the columns are {}", excerpt(origin, 256), excerpt(name),
                              fmt::join(excerpts(columns), ", ")));
}

namespace {

// Feeds the parser chunk by chunk; `next` fills the buffer and returns the bytes it put there (0 at the end).
template <typename Next>
CsvTable parse(const std::string& origin, const CsvOptions& options, Next next) {
  csv_parser parser;
  if (csv_init(&parser, CSV_STRICT | CSV_STRICT_FINI) != 0) {
    throw DataError(fmt::format("{}: cannot set up the CSV parser", excerpt(origin, 256)));
  }
  std::unique_ptr<csv_parser, void (*)(csv_parser*)> guard(&parser, csv_free);
  csv_set_delim(&parser, static_cast<unsigned char>(options.delimiter));
  // Fields keep their spaces, as pandas and Python's csv module keep them (libcsv trims by default).
  csv_set_space_func(&parser, [](unsigned char) { return 0; });
  Reader reader;
  reader.origin = origin;
  reader.header = options.header;
  bool first = true;
  for (std::string_view chunk; !(chunk = next()).empty();) {
    if (first && chunk.starts_with("\xEF\xBB\xBF")) chunk.remove_prefix(3);  // a UTF-8 byte order mark
    first = false;
    if (csv_parse(&parser, chunk.data(), chunk.size(), on_field, on_row, &reader) != chunk.size()) {
      throw DataError(fmt::format("{}: malformed CSV near row {}: {}", excerpt(origin, 256), reader.rows_seen + 1,
                                  csv_strerror(csv_error(&parser))));
    }
    if (!reader.error.empty()) throw DataError(reader.error);
  }
  if (csv_fini(&parser, on_field, on_row, &reader) != 0) {
    throw DataError(fmt::format("{}: malformed CSV at the end (row {}): {}", excerpt(origin, 256), reader.rows_seen + 1,
                                csv_strerror(csv_error(&parser))));
  }
  if (!reader.error.empty()) throw DataError(reader.error);
  if (reader.rows_seen == 0) throw DataError(fmt::format("{}: the file is empty", excerpt(origin, 256)));
  return std::move(reader.table);
}

}  // namespace

CsvTable parse_csv(std::string_view text, std::string_view origin, const CsvOptions& options) {
  bool given = false;
  return parse(std::string(origin), options, [&]() -> std::string_view {
    if (given) return {};
    given = true;
    return text;
  });
}

CsvTable read_csv(const std::filesystem::path& file, const CsvOptions& options) {
  const std::string origin = file.string();
  std::ifstream in(file, std::ios::binary);
  if (!in) throw DataError(fmt::format("{}: cannot open", excerpt(origin, 256)));
  std::vector<char> buffer(std::size_t{1} << 16);
  return parse(origin, options, [&]() -> std::string_view {
    if (!in) return {};
    in.read(buffer.data(), static_cast<std::streamsize>(buffer.size()));
    if (in.bad()) throw DataError(fmt::format("{}: read error", excerpt(origin, 256)));
    return {buffer.data(), static_cast<std::size_t>(in.gcount())};
  });
}

std::optional<bool> csv_flag(std::string_view cell) {
  std::string t(cell);
  std::transform(t.begin(), t.end(), t.begin(), [](unsigned char c) { return std::tolower(c); });
  if (t == "true" || t == "1" || t == "yes") return true;
  if (t == "false" || t == "0" || t == "no" || t.empty()) return false;
  return std::nullopt;
}

}  // namespace fastlearn
