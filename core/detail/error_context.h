#pragma once
// An error met on another thread (a replica's, a worker's), thrown again on the caller's with where it happened in
// front of its message, and of the same kind: a DataError stays a DataError (and the C interface's status with it).
#include <exception>
#include <string>

namespace fastlearn {

/// Throws `error` again as the same fastlearn kind (DataError, ConfigError with a ConfigFileError's key and
/// position, CheckpointError, DistributedError, Error) with the message "<context>: <its message>". Anything
/// else (a LibTorch error without its backtrace, a std::exception) becomes an Error.
[[noreturn]] void rethrow_with_context(const std::exception_ptr& error, const std::string& context);

/// The message of `error` (a LibTorch error's without its backtrace).
std::string message_of(const std::exception_ptr& error);

}  // namespace fastlearn
