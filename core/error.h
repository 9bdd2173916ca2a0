#pragma once
// The one exception family of fastlearn: every error says what was wrong, where, and what to do.
#include <stdexcept>
#include <string>

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

/// Unreadable, torn or incompatible checkpoint.
class CheckpointError : public Error {
 public:
  using Error::Error;
};

}  // namespace fastlearn
