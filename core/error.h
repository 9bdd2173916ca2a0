#pragma once
// The one exception family of fastlearn: every error says what was wrong, where, and what to do.
#include <stdexcept>
#include <string>
#include <utility>

namespace fastlearn {

/// Base of every error fastlearn throws.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// Bad or corrupt input data (files, archives, datasets).
class DataError : public Error {
 public:
  using Error::Error;
};

/// Inconsistent distributed environment, failed collective, dead or hanging peer.
class DistributedError : public Error {
 public:
  using Error::Error;
};

/// Malformed configuration or option values.
class ConfigError : public Error {
 public:
  using Error::Error;
};

/// A configuration file that cannot be used (fastlearn::load_config): says which key is to blame (when one is),
/// where (file:line:col, or the --set argument) and what is expected.
class ConfigFileError : public ConfigError {
 public:
  ConfigFileError(const std::string& message, std::string key, int line, int column)
      : ConfigError(message), key_(std::move(key)), line_(line), column_(column) {}
  /// The dotted key at fault ("train.epochs"); empty for a syntax error.
  const std::string& key() const { return key_; }
  /// 1-based position in the file, 0 when unknown (e.g. a value given with --set).
  int line() const { return line_; }
  int column() const { return column_; }

 private:
  std::string key_;
  int line_;
  int column_;
};

/// Unreadable, torn or incompatible checkpoint.
class CheckpointError : public Error {
 public:
  using Error::Error;
};

}  // namespace fastlearn
