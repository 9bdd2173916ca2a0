#pragma once
// Strict TOML for configuration files, free of any schema: a document read key by key against what each
// key accepts (a wrong type, an out-of-range value or an unknown key is an error that says where and what is
// expected; an unknown key names the closest known one), `--set key=value` overrides applied as if they
// were in the file, and a writer that keeps keys in the order given. The keys of a training config are in
// config/train_config.cpp. No torch and no toml++ in this header.
#include <fastlearn/config/switch.h>
#include <fastlearn/core/error.h>

#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

namespace fastlearn::strict {

/// The value of a key, one alternative per kind of key.
using Value = std::variant<bool, std::int64_t, double, std::string, std::vector<std::int64_t>, std::vector<std::string>,
                           std::vector<std::vector<std::int64_t>>, std::vector<double>>;

// What a key accepts (numbers: >= 0 unless set otherwise); errors say it in words ("an integer in [1, 64]").
struct Boolean {};
struct BooleanOrAuto {};
struct Integer {
  std::int64_t min = 0;
  std::int64_t max = std::numeric_limits<std::int64_t>::max();
};
/// A finite float, or an integer (read as a double): min < value (min <= value when min_inclusive) <= max.
struct Number {
  double min = 0;
  bool min_inclusive = true;
  double max = std::numeric_limits<double>::infinity();
};
/// A string, one of `choices` unless that is empty.
struct String {
  std::vector<std::string> choices;
};
struct Integers {
  std::int64_t min = 0;  ///< of every element
  bool allow_empty = true;
};
struct Strings {};
/// An array of arrays of integers (shapes: [[8], [4, 4]]), each element >= min.
struct IntegerLists {
  std::int64_t min = 0;
  bool allow_empty = true;  ///< of the inner arrays
};
/// An array of finite numbers (integers read as doubles).
struct Numbers {};
using Spec = std::variant<Boolean, BooleanOrAuto, Integer, Number, String, Integers, Strings, IntegerLists, Numbers>;

/// The Spec for a field of type T; std::optional<T>: T's (for a key whose absence means "not set"). The
/// overloads are declared only, SpecFor<T> picks one.
Boolean spec_for(const bool*);
BooleanOrAuto spec_for(const Switch*);
Integer spec_for(const std::int64_t*);
Number spec_for(const double*);
String spec_for(const std::string*);
Integers spec_for(const std::vector<std::int64_t>*);
Strings spec_for(const std::vector<std::string>*);
IntegerLists spec_for(const std::vector<std::vector<std::int64_t>>*);
Numbers spec_for(const std::vector<double>*);
template <class T>
auto spec_for(const std::optional<T>*) -> decltype(spec_for(static_cast<const T*>(nullptr)));
template <class T>
using SpecFor = decltype(spec_for(static_cast<const T*>(nullptr)));

/// A parsed TOML document, read against the dotted keys of a schema.
class Document {
 public:
  /// Parses `text` (a syntax error is a ConfigFileError with its line and column); `source` names the text in
  /// messages. `keys` are the schema's dotted keys ("train.epochs"); the tables that hold them are known too,
  /// and the order of `keys` decides between equally close suggestions.
  Document(std::string_view text, std::string_view source, std::span<const std::string> keys);
  ~Document();
  Document(const Document&) = delete;
  Document& operator=(const Document&) = delete;

  /// Applies one `--set key=value` as if it were in the text: the value is TOML (5, 3e-3, true, [64, 32],
  /// "x"), or else a bare string (resnet). Errors name the argument.
  void set(const std::string& assignment);

  /// Whether the table `key` is given; an error when `key` holds something else.
  bool table(std::string_view key) const;
  /// The value of `key` when it is given, checked against `spec`.
  std::optional<Value> read(std::string_view key, const Spec& spec) const;
  /// Throws the ConfigFileError "<where>: <key>: <what>" (where: the key's line, or the --set that gave it).
  [[noreturn]] void invalid(std::string_view key, std::string_view what) const;
  /// Throws a ConfigFileError for the first key (in the text's order) that is not in the schema, naming the
  /// closest known key; returns when there is none.
  void reject_unknown() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// A Switch as its Value (true, false or "auto"), and back from a Value that BooleanOrAuto accepted.
Value switch_value(Switch value);
Switch switch_from(const Value& value);

/// The schema's keys by table, one line each ("[train] epochs, lr, ..."), tables in order of first appearance.
std::string describe_tables(std::span<const std::string> keys);

/// Writes TOML by hand, keys in the order given under their table's header (toml++'s printer sorts keys and
/// prints floats with 17 digits).
class Writer {
 public:
  /// Declares the table `name`: its header is written even when no key follows (an empty table can mean "on").
  void table(std::string_view name);
  /// Writes `key = value` under the header of the key's table ("train.lr" goes to [train]).
  void put(std::string_view key, const Value& value);
  /// The tables in order of first appearance (a table after the one that holds it), blank lines between.
  std::string text() const;

 private:
  struct Table {
    std::string name;
    bool declared = false;
    std::vector<std::string> lines;
  };
  Table& at(std::string_view name);
  std::vector<Table> tables_;
};

}  // namespace fastlearn::strict
