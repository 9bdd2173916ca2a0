#include <fastlearn/launch/detail/prefixed_output.h>

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace fastlearn::detail {

namespace {

// A partial line longer than this is written out anyway (a program that never ends its lines).
constexpr std::size_t kMaxHeldLine = 64 * 1024;

void write_segment(PrefixedStream& s, const std::string& prefix, const char* data, std::size_t size) {
  if (size == 0) return;
  if (s.at_line_start) std::fwrite(prefix.data(), 1, prefix.size(), s.sink);
  std::fwrite(data, 1, size, s.sink);
  const char last = data[size - 1];
  s.at_line_start = last == '\n' || last == '\r';
}

void consume(PrefixedStream& s, const std::string& prefix, const char* data, std::size_t size) {
  std::size_t i = 0;
  if (s.after_cr && size > 0 && data[0] == '\n') {
    // The '\n' of a "\r\n" split across two reads: it belongs to the segment already written.
    std::fputc('\n', s.sink);
    i = 1;
  }
  s.after_cr = false;
  while (i < size) {
    const void* hit_n = std::memchr(data + i, '\n', size - i);
    const void* hit_r = std::memchr(data + i, '\r', size - i);
    const char* end = nullptr;
    if (hit_n && hit_r)
      end = std::min(static_cast<const char*>(hit_n), static_cast<const char*>(hit_r));
    else
      end = static_cast<const char*>(hit_n ? hit_n : hit_r);
    if (!end) {
      s.held.append(data + i, size - i);
      s.after_cr = false;
      if (s.held.size() > kMaxHeldLine) {
        write_segment(s, prefix, s.held.data(), s.held.size());
        s.held.clear();
      }
      return;
    }
    std::size_t stop = static_cast<std::size_t>(end - data) + 1;
    if (*end == '\r' && stop < size && data[stop] == '\n') ++stop;  // "\r\n" is one line end
    s.held.append(data + i, stop - i);
    write_segment(s, prefix, s.held.data(), s.held.size());
    s.held.clear();
    s.after_cr = *end == '\r' && stop == static_cast<std::size_t>(end - data) + 1;
    i = stop;
  }
}

}  // namespace

void finish(PrefixedStream& s, const std::string& prefix) {
  if (!s.held.empty()) {
    s.held.push_back('\n');
    write_segment(s, prefix, s.held.data(), s.held.size());
    s.held.clear();
  }
  if (s.fd >= 0) close(s.fd);
  s.fd = -1;
}

bool pump(PrefixedStream& s, const std::string& prefix, std::FILE* log, int* log_errno) {
  char buffer[16384];
  for (int round = 0; round < 8; ++round) {
    const ssize_t n = read(s.fd, buffer, sizeof buffer);
    if (n > 0) {
      if (log) {
        errno = 0;
        const bool written = std::fwrite(buffer, 1, static_cast<std::size_t>(n), log) == static_cast<std::size_t>(n) &&
                             std::fflush(log) == 0;
        if (!written && log_errno) *log_errno = errno != 0 ? errno : EIO;
        if (!written) log = nullptr;  // the rest of this read goes to the terminal only
      }
      consume(s, prefix, buffer, static_cast<std::size_t>(n));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return true;
    return false;  // EOF, or an error that ends the stream all the same
  }
  return true;
}

}  // namespace fastlearn::detail
