#include <fastlearn/data/csv.h>

#include <csv.h>
#include <fastlearn/core/error.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cctype>
#include <fstream>
#include <memory>

namespace fastlearn {
namespace {

// Whether `text` is well-formed UTF-8 (no overlong forms, surrogates or code points above U+10FFFF).
bool is_utf8(std::string_view text) {
  const auto* p = reinterpret_cast<const unsigned char*>(text.data());
  const auto* end = p + text.size();
  while (p < end) {
    const unsigned char c = *p;
    int more = 0;
    unsigned char lo = 0x80, hi = 0xBF;  // the range of the first continuation byte
    if (c < 0x80) {
      ++p;
      continue;
    } else if (c >= 0xC2 && c <= 0xDF) {
      more = 1;
    } else if (c >= 0xE0 && c <= 0xEF) {
      more = 2;
      if (c == 0xE0) lo = 0xA0;
      if (c == 0xED) hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
      more = 3;
      if (c == 0xF0) lo = 0x90;
      if (c == 0xF4) hi = 0x8F;
    } else {
      return false;
    }
    if (end - p <= more || p[1] < lo || p[1] > hi) return false;
    for (int k = 2; k <= more; ++k) {
      if (p[k] < 0x80 || p[k] > 0xBF) return false;
    }
    p += more + 1;
  }
  return true;
}

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
      if (!is_utf8(row[k])) {
        error = fmt::format(
            "{}: {}, field {} is not UTF-8 text (CSV files are read as UTF-8, as pandas reads "
            "them; convert it first, e.g. iconv -f latin1 -t utf-8)",
            origin, where(), k + 1);
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
        error = fmt::format("{}: {} has {} field(s), the first row has {}", origin, where(), row.size(),
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
  throw DataError(fmt::format("{}: no column '{}'; the columns are {}", origin, name, fmt::join(columns, ", ")));
}

namespace {

// Feeds the parser chunk by chunk; `next` fills the buffer and returns the bytes it put there (0 at the end).
template <typename Next>
CsvTable parse(const std::string& origin, const CsvOptions& options, Next next) {
  csv_parser parser;
  if (csv_init(&parser, CSV_STRICT | CSV_STRICT_FINI) != 0) {
    throw DataError(fmt::format("{}: cannot set up the CSV parser", origin));
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
      throw DataError(fmt::format("{}: malformed CSV near row {}: {}", origin, reader.rows_seen + 1,
                                  csv_strerror(csv_error(&parser))));
    }
    if (!reader.error.empty()) throw DataError(reader.error);
  }
  if (csv_fini(&parser, on_field, on_row, &reader) != 0) {
    throw DataError(fmt::format("{}: malformed CSV at the end (row {}): {}", origin, reader.rows_seen + 1,
                                csv_strerror(csv_error(&parser))));
  }
  if (!reader.error.empty()) throw DataError(reader.error);
  if (reader.rows_seen == 0) throw DataError(fmt::format("{}: the file is empty", origin));
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
  if (!in) throw DataError(fmt::format("{}: cannot open", origin));
  std::vector<char> buffer(std::size_t{1} << 16);
  return parse(origin, options, [&]() -> std::string_view {
    if (!in) return {};
    in.read(buffer.data(), static_cast<std::streamsize>(buffer.size()));
    if (in.bad()) throw DataError(fmt::format("{}: read error", origin));
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
