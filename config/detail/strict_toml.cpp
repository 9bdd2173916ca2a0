#include <fastlearn/config/detail/strict_toml.h>

#include <fastlearn/core/detail/suggest.h>
#include <fastlearn/core/detail/text.h>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <toml++/toml.h>

#include <algorithm>
#include <cmath>
#include <map>

namespace fastlearn::strict {

namespace {

std::string type_name(const toml::node& node) {
  switch (node.type()) {
    case toml::node_type::table:
      return "a table";
    case toml::node_type::array:
      return "an array";
    case toml::node_type::string:
      return fmt::format("the string \"{}\"", excerpt(*node.value<std::string>()));
    case toml::node_type::integer:
      return fmt::format("the integer {}", *node.value<std::int64_t>());
    case toml::node_type::floating_point:
      return fmt::format("the float {}", *node.value_exact<double>());
    case toml::node_type::boolean:
      return fmt::format("the boolean {}", *node.value<bool>());
    case toml::node_type::date:
      return "a date";
    case toml::node_type::time:
      return "a time";
    case toml::node_type::date_time:
      return "a date-time";
    default:
      return "nothing";
  }
}

// What `spec` accepts, in words: "an integer in [1, 64]".
std::string describe(const Spec& spec) {
  struct {
    std::string operator()(const Boolean&) const { return "a boolean (true or false)"; }
    std::string operator()(const BooleanOrAuto&) const { return "true, false or \"auto\""; }
    std::string operator()(const Integer& s) const {
      if (s.max == std::numeric_limits<std::int64_t>::max()) return fmt::format("an integer >= {}", s.min);
      return fmt::format("an integer in [{}, {}]", s.min, s.max);
    }
    std::string operator()(const Number& s) const {
      auto text = fmt::format("a number {} {}", s.min_inclusive ? ">=" : ">", s.min);
      return std::isfinite(s.max) ? text + fmt::format(" and <= {}", s.max) : text;
    }
    std::string operator()(const String& s) const {
      return s.choices.empty() ? "a string" : fmt::format("one of \"{}\"", fmt::join(s.choices, "\", \""));
    }
    std::string operator()(const Integers& s) const {
      return fmt::format("{} array of integers >= {}", s.allow_empty ? "an" : "a non-empty", s.min);
    }
    std::string operator()(const Strings&) const { return "an array of strings"; }
    std::string operator()(const Numbers&) const { return "an array of numbers"; }
    std::string operator()(const IntegerLists& s) const {
      return fmt::format("an array of {}arrays of integers >= {}", s.allow_empty ? "" : "non-empty ", s.min);
    }
  } words;
  return std::visit(words, spec);
}

std::string_view parent_of(std::string_view key) {
  const auto dot = key.rfind('.');
  return dot == std::string_view::npos ? std::string_view() : key.substr(0, dot);
}

std::string_view leaf_of(std::string_view key) {
  const auto dot = key.rfind('.');
  return dot == std::string_view::npos ? key : key.substr(dot + 1);
}

std::string join(std::string_view table, std::string_view key) {
  return table.empty() ? std::string(key) : fmt::format("{}.{}", table, key);
}

// The schema's keys with the tables that hold them, each table before its first key ("data", "data.bs").
std::vector<std::string> with_tables(std::span<const std::string> keys) {
  std::vector<std::string> all;
  const auto add = [&](std::string_view name) {
    if (std::find(all.begin(), all.end(), name) == all.end()) all.emplace_back(name);
  };
  for (const auto& key : keys) {
    for (auto dot = key.find('.'); dot != std::string::npos; dot = key.find('.', dot + 1)) add(key.substr(0, dot));
    add(key);
  }
  return all;
}

}  // namespace

struct Document::Impl {
  std::string source;
  toml::table root;
  std::vector<std::string> known;                 // the schema's keys and tables
  std::vector<std::string> tables;                // the tables of `known`
  std::map<std::string, std::string> overridden;  // dotted key -> the --set argument
  struct Unknown {
    std::string key;  // dotted
    toml::source_region where;
  };

  // "config.toml:3:9", or "--set train.epochs=x" for a value given on the command line.
  std::string location(const std::string& key, const toml::source_region& where) const {
    for (std::string prefix = key;;) {
      if (auto it = overridden.find(prefix); it != overridden.end())
        return fmt::format("--set {}", excerpt(it->second));
      const auto dot = prefix.rfind('.');
      if (dot == std::string::npos) break;
      prefix.resize(dot);
    }
    if (where.begin.line == 0) return excerpt(source, 256);
    return fmt::format("{}:{}:{}", excerpt(source, 256), where.begin.line, where.begin.column);
  }

  [[noreturn]] void fail(const std::string& key, const toml::source_region& where, const std::string& what) const {
    const std::string at = location(key, where);
    const bool from_set = at.starts_with("--set");
    throw ConfigFileError(fmt::format("{}: {}", at, what), key, from_set ? 0 : static_cast<int>(where.begin.line),
                          from_set ? 0 : static_cast<int>(where.begin.column));
  }

  [[noreturn]] void expected(const std::string& key, const toml::node& node, const std::string& expectation) const {
    fail(key, node.source(), fmt::format("{} must be {}, not {}", key, expectation, type_name(node)));
  }

  // The node at a dotted key; nullptr when absent. A non-table on the way: an error when `check_tables`, else nullptr.
  const toml::node* find(std::string_view key, bool check_tables) const {
    const toml::table* table = &root;
    for (std::size_t start = 0;;) {
      const auto dot = key.find('.', start);
      const toml::node* node = table->get(key.substr(start, dot == std::string_view::npos ? dot : dot - start));
      if (!node || dot == std::string_view::npos) return node;
      if (!node->is_table()) {
        if (check_tables) expected(std::string(key.substr(0, dot)), *node, "a table");
        return nullptr;
      }
      table = node->as_table();
      start = dot + 1;
    }
  }

  // Every key not in the schema: in the tables below `table` first (in schema order), then in `table` itself.
  void collect_unknown(const toml::table& table, std::string_view name, std::vector<Unknown>& unknown) const {
    for (const auto& below : tables) {
      if (parent_of(below) != name) continue;
      if (const toml::node* node = table.get(leaf_of(below)); node && node->is_table())
        collect_unknown(*node->as_table(), below, unknown);
    }
    for (auto&& [key, node] : table) {
      std::string dotted = join(name, key.str());
      if (std::find(known.begin(), known.end(), dotted) == known.end())
        unknown.push_back({std::move(dotted), key.source()});
    }
  }
};

Document::Document(std::string_view text, std::string_view source, std::span<const std::string> keys)
    : impl_(std::make_unique<Impl>()) {
  impl_->source = std::string(source);
  impl_->known = with_tables(keys);
  for (const auto& key : impl_->known) {
    if (const auto table = parent_of(key);
        !table.empty() && std::find(impl_->tables.begin(), impl_->tables.end(), table) == impl_->tables.end())
      impl_->tables.emplace_back(table);
  }
  try {
    impl_->root = toml::parse(text, source);
  } catch (const toml::parse_error& e) {
    const auto& where = e.source().begin;
    throw ConfigFileError(
        fmt::format("{}:{}:{}: TOML syntax error: {}", excerpt(source, 256), where.line, where.column, e.description()),
        "", static_cast<int>(where.line), static_cast<int>(where.column));
  }
}

Document::~Document() = default;

void Document::set(const std::string& assignment) {
  const auto eq = assignment.find('=');
  if (eq == std::string::npos || eq == 0)
    throw ConfigFileError(fmt::format("--set {}: expected key=value, e.g. --set train.epochs=5", excerpt(assignment)),
                          "", 0, 0);
  const std::string key = assignment.substr(0, eq);
  const std::string text = assignment.substr(eq + 1);
  std::vector<std::string> parts;
  for (std::size_t start = 0;;) {
    const auto dot = key.find('.', start);
    parts.push_back(key.substr(start, dot == std::string::npos ? std::string::npos : dot - start));
    if (parts.back().empty())
      throw ConfigFileError(
          fmt::format("--set {}: '{}' is not a dotted key such as train.epochs", excerpt(assignment), excerpt(key)),
          key, 0, 0);
    if (dot == std::string::npos) break;
    start = dot + 1;
  }
  toml::table parsed;
  try {
    parsed = toml::parse(std::string_view("value = " + text), std::string_view("--set"));
  } catch (const toml::parse_error&) {
    parsed = toml::table{{"value", text}};  // not TOML: a bare string
  }
  toml::table* table = &impl_->root;
  std::string walked;
  for (std::size_t i = 0; i + 1 < parts.size(); ++i) {
    walked += (walked.empty() ? "" : ".") + parts[i];
    toml::node* node = table->get(parts[i]);
    if (!node) node = table->insert(parts[i], toml::table{}).first->second.as_table();
    if (!node->is_table())
      throw ConfigFileError(
          fmt::format("--set {}: {} is {}, not a table", excerpt(assignment), excerpt(walked), type_name(*node)),
          walked, 0, 0);
    table = node->as_table();
  }
  table->insert_or_assign(parts.back(), std::move(*parsed.get("value")));
  impl_->overridden[key] = assignment;
}

bool Document::table(std::string_view key) const {
  const toml::node* node = impl_->find(key, true);
  if (node && !node->is_table()) impl_->expected(std::string(key), *node, "a table");
  return node != nullptr;
}

std::optional<Value> Document::read(std::string_view key, const Spec& spec) const {
  const toml::node* node = impl_->find(key, true);
  if (!node) return std::nullopt;
  const std::string dotted(key);
  const auto fail = [&](const toml::node& at) { impl_->expected(dotted, at, describe(spec)); };
  if (std::holds_alternative<Boolean>(spec)) {
    if (!node->is_boolean()) fail(*node);
    return *node->value<bool>();
  }
  if (std::holds_alternative<BooleanOrAuto>(spec)) {
    if (node->is_boolean()) return *node->value<bool>();
    if (!node->is_string() || *node->value<std::string>() != "auto") fail(*node);
    return std::string("auto");
  }
  if (const auto* s = std::get_if<Integer>(&spec)) {
    if (!node->is_integer()) fail(*node);
    const auto value = *node->value<std::int64_t>();
    if (value < s->min || value > s->max) fail(*node);
    return value;
  }
  if (const auto* s = std::get_if<Number>(&spec)) {
    if (!node->is_number()) fail(*node);
    // Not value<double>(): it refuses integers a double cannot hold exactly.
    const double value =
        node->is_integer() ? static_cast<double>(*node->value<std::int64_t>()) : *node->value_exact<double>();
    if (!(s->min_inclusive ? value >= s->min : value > s->min) || value > s->max || !std::isfinite(value)) fail(*node);
    return value;
  }
  if (const auto* s = std::get_if<String>(&spec)) {
    if (!node->is_string()) fail(*node);
    auto value = *node->value<std::string>();
    if (!s->choices.empty() && std::find(s->choices.begin(), s->choices.end(), value) == s->choices.end()) fail(*node);
    return value;
  }
  const auto* array = node->as_array();
  if (const auto* s = std::get_if<Integers>(&spec)) {
    if (!array || (!s->allow_empty && array->empty())) fail(*node);
    std::vector<std::int64_t> values;
    for (const auto& element : *array) {
      if (!element.is_integer() || *element.value<std::int64_t>() < s->min) fail(element);
      values.push_back(*element.value<std::int64_t>());
    }
    return values;
  }
  if (const auto* s = std::get_if<IntegerLists>(&spec)) {
    if (!array) fail(*node);
    std::vector<std::vector<std::int64_t>> lists;
    for (const auto& element : *array) {
      const auto* inner = element.as_array();
      if (!inner || (!s->allow_empty && inner->empty())) fail(element);
      auto& list = lists.emplace_back();
      for (const auto& value : *inner) {
        if (!value.is_integer() || *value.value<std::int64_t>() < s->min) fail(value);
        list.push_back(*value.value<std::int64_t>());
      }
    }
    return lists;
  }
  if (std::holds_alternative<Numbers>(spec)) {
    if (!array) fail(*node);
    std::vector<double> values;
    for (const auto& element : *array) {
      if (!element.is_number()) fail(element);
      const double value =
          element.is_integer() ? static_cast<double>(*element.value<std::int64_t>()) : *element.value_exact<double>();
      if (!std::isfinite(value)) fail(element);
      values.push_back(value);
    }
    return values;
  }
  if (!array) fail(*node);  // Strings
  std::vector<std::string> values;
  for (const auto& element : *array) {
    if (!element.is_string()) fail(element);
    values.push_back(*element.value<std::string>());
  }
  return values;
}

void Document::invalid(std::string_view key, std::string_view what) const {
  const toml::node* node = impl_->find(key, false);
  impl_->fail(std::string(key), node ? node->source() : toml::source_region{}, fmt::format("{}: {}", key, what));
}

void Document::reject_unknown() const {
  std::vector<Impl::Unknown> unknown;
  impl_->collect_unknown(impl_->root, "", unknown);
  if (unknown.empty()) return;
  const auto& first = *std::min_element(unknown.begin(), unknown.end(), [](const auto& a, const auto& b) {
    return std::pair(a.where.begin.line, a.where.begin.column) < std::pair(b.where.begin.line, b.where.begin.column);
  });
  const std::string_view table = parent_of(first.key);
  const std::string_view leaf = leaf_of(first.key);
  // Prefer the same name in another table (`epochs` under [data] -> train.epochs), then the closest key of the
  // same table, then the closest anywhere.
  std::string best;
  std::size_t best_score = std::numeric_limits<std::size_t>::max();
  std::vector<std::string> siblings;
  for (const auto& known : impl_->known) {
    const std::string_view known_leaf = leaf_of(known);
    const bool same_table = parent_of(known) == table;
    if (same_table && std::find(siblings.begin(), siblings.end(), known_leaf) == siblings.end())
      siblings.emplace_back(known_leaf);
    const std::size_t score = known_leaf == leaf ? 0 : 1 + 2 * edit_distance(leaf, known_leaf) + (same_table ? 0 : 3);
    if (score < best_score) best_score = score, best = known;
  }
  std::sort(siblings.begin(), siblings.end());
  const std::string where = table.empty() ? "at the top level" : fmt::format("in [{}]", excerpt(table));
  impl_->fail(first.key, first.where,
              fmt::format("unknown key {}; did you mean {}? (valid keys {}: {})", excerpt(first.key), best, where,
                          fmt::join(siblings, ", ")));
}

Value switch_value(Switch value) {
  if (value == Switch::automatic) return std::string("auto");
  return value == Switch::on;
}

Switch switch_from(const Value& value) {
  if (const bool* b = std::get_if<bool>(&value)) return *b ? Switch::on : Switch::off;
  return Switch::automatic;
}

std::string describe_tables(std::span<const std::string> keys) {
  std::vector<std::pair<std::string_view, std::vector<std::string_view>>> tables;  // "data" -> its keys
  const auto all = with_tables(keys);
  for (const auto& key : all) {
    const auto table = parent_of(key);
    if (table.empty()) continue;  // the top-level tables themselves
    auto it = std::find_if(tables.begin(), tables.end(), [&](const auto& t) { return t.first == table; });
    if (it == tables.end()) it = tables.insert(tables.end(), {table, {}});
    it->second.push_back(leaf_of(key));
  }
  std::vector<std::string> lines;
  for (const auto& [table, names] : tables) lines.push_back(fmt::format("[{}] {}", table, fmt::join(names, ", ")));
  return fmt::format("{}", fmt::join(lines, "\n  "));
}

namespace {

std::string quote(const std::string& value) {
  std::string q = "\"";
  for (const unsigned char c : value) {
    switch (c) {
      case '"':
        q += "\\\"";
        break;
      case '\\':
        q += "\\\\";
        break;
      case '\n':
        q += "\\n";
        break;
      case '\t':
        q += "\\t";
        break;
      case '\r':
        q += "\\r";
        break;
      default:
        if (c < 0x20 || c == 0x7f)
          q += fmt::format("\\u{:04X}", c);
        else
          q += static_cast<char>(c);
    }
  }
  return q + "\"";
}

std::string toml_text(const Value& value) {
  struct {
    std::string operator()(bool v) const { return v ? "true" : "false"; }
    std::string operator()(std::int64_t v) const { return fmt::format("{}", v); }
    std::string operator()(double v) const {
      auto text = fmt::format("{}", v);  // the shortest text that reads back as the same double
      if (text.find_first_of(".eEn") == std::string::npos) text += ".0";
      return text;
    }
    std::string operator()(const std::string& v) const { return quote(v); }
    std::string operator()(const std::vector<std::int64_t>& v) const { return fmt::format("[{}]", fmt::join(v, ", ")); }
    std::string operator()(const std::vector<double>& v) const {
      std::vector<std::string> numbers;
      for (const auto x : v) numbers.push_back((*this)(x));
      return fmt::format("[{}]", fmt::join(numbers, ", "));
    }
    std::string operator()(const std::vector<std::vector<std::int64_t>>& v) const {
      std::vector<std::string> inner;
      for (const auto& list : v) inner.push_back((*this)(list));
      return fmt::format("[{}]", fmt::join(inner, ", "));
    }
    std::string operator()(const std::vector<std::string>& v) const {
      std::vector<std::string> quoted;
      for (const auto& s : v) quoted.push_back(quote(s));
      return fmt::format("[{}]", fmt::join(quoted, ", "));
    }
  } text;
  return std::visit(text, value);
}

}  // namespace

Writer::Table& Writer::at(std::string_view name) {
  const auto it = std::find_if(tables_.begin(), tables_.end(), [&](const Table& t) { return t.name == name; });
  if (it != tables_.end()) return *it;
  if (!name.empty()) at(parent_of(name));  // the table that holds this one comes first
  return tables_.emplace_back(Table{.name = std::string(name)});
}

void Writer::table(std::string_view name) { at(name).declared = true; }

void Writer::put(std::string_view key, const Value& value) {
  at(parent_of(key)).lines.push_back(fmt::format("{} = {}\n", leaf_of(key), toml_text(value)));
}

std::string Writer::text() const {
  std::string out;
  for (const auto& table : tables_) {
    if (!table.name.empty() && (table.declared || !table.lines.empty()))
      out += fmt::format("{}[{}]\n", out.empty() ? "" : "\n", table.name);
    for (const auto& line : table.lines) out += line;
  }
  return out;
}

}  // namespace fastlearn::strict
