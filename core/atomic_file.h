#pragma once
// Atomic file replacement: readers see either the old file or the complete new one, never a torn mix,
// also after a crash or power loss (the data and the rename are fsync()ed).
#include <filesystem>
#include <functional>
#include <iosfwd>
#include <string_view>

namespace fastlearn {

/// Writes `path` by calling `write` on a stream over a new temporary file in the same directory
/// (".<name>.tmp.<pid>.<random>"), then flushes and fsync()s it, renames it over `path` and fsync()s the
/// directory. If `write` throws, that exception propagates; if a system call fails, a fastlearn::Error
/// naming the path and the errno message is thrown. Either way the temporary is removed and an existing
/// file at `path` is untouched, unless only the final directory fsync() failed (the message says so).
void write_file_atomically(const std::filesystem::path& path, const std::function<void(std::ostream&)>& write);

/// write_file_atomically for bytes already in memory.
void write_file_atomically(const std::filesystem::path& path, std::string_view bytes);

}  // namespace fastlearn
