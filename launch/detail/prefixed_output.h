#pragma once
// Internal to launch(): one output pipe of a rank, read without blocking and written on line by line with its prefix.
#include <cstdio>
#include <string>

namespace fastlearn::detail {

// One output pipe of a rank: bytes are cut into segments that end with '\n' or '\r' and written with the prefix.
struct PrefixedStream {
  int fd = -1;                // the read end of the pipe (non-blocking); -1 once the stream has ended
  std::FILE* sink = nullptr;  // where the prefixed segments go
  std::string held;           // a segment still waiting for its end
  bool at_line_start = true;  // the next bytes written start a segment: write the prefix first
  bool after_cr = false;      // the last segment ended with '\r': a '\n' right after it completes a "\r\n"
};

/// Reads what the stream has now (bounded, so one chatty rank cannot starve the loop), copying the raw bytes
/// to `log` when it is not null; a failed write to `log` sets `*log_errno` (when given) and stops copying to it.
/// False at its end (EOF, or an error that ends it all the same).
bool pump(PrefixedStream& s, const std::string& prefix, std::FILE* log, int* log_errno = nullptr);

/// The end of a stream: what is still held is written as a last line, and the pipe is closed.
void finish(PrefixedStream& s, const std::string& prefix);

}  // namespace fastlearn::detail
