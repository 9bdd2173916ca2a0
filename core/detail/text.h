#pragma once
// User text in fastlearn's messages and files: whether it is UTF-8, and the bounded excerpt an error quotes.
// fastlearn writes names (classes, columns, categories) into JSON, safetensors metadata, SVG and logs, all UTF-8;
// a name that is not UTF-8 is refused where it enters, naming where it came from, rather than when a file is
// written an epoch later. Header-only: the configuration reader, which does not link the library, uses it too.
#include <fastlearn/core/error.h>

#include <fmt/format.h>

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace fastlearn {

namespace detail {
// The length of the valid UTF-8 sequence at text[i] (RFC 3629: no overlong forms, no surrogates, nothing above
// U+10FFFF), or 0 when the bytes there are not one.
inline std::size_t utf8_sequence_at(std::string_view text, std::size_t i) {
  const auto byte = [&](std::size_t k) { return static_cast<unsigned char>(text[k]); };
  const unsigned char b = byte(i);
  if (b < 0x80) return 1;
  std::size_t n = 0;
  unsigned char lo = 0x80, hi = 0xBF;  // the range of the second byte
  if (b >= 0xC2 && b <= 0xDF) {
    n = 2;
  } else if (b >= 0xE0 && b <= 0xEF) {
    n = 3;
    if (b == 0xE0) lo = 0xA0;
    if (b == 0xED) hi = 0x9F;
  } else if (b >= 0xF0 && b <= 0xF4) {
    n = 4;
    if (b == 0xF0) lo = 0x90;
    if (b == 0xF4) hi = 0x8F;
  } else {
    return 0;
  }
  if (i + n > text.size()) return 0;
  if (byte(i + 1) < lo || byte(i + 1) > hi) return 0;
  for (std::size_t k = 2; k < n; ++k)
    if (byte(i + k) < 0x80 || byte(i + k) > 0xBF) return 0;
  return n;
}
}  // namespace detail

/// The offset of the first byte of `text` that is not part of valid UTF-8, or nothing when all of it is.
inline std::optional<std::size_t> invalid_utf8_at(std::string_view text) {
  for (std::size_t i = 0; i < text.size();) {
    const auto n = detail::utf8_sequence_at(text, i);
    if (n == 0) return i;
    i += n;
  }
  return std::nullopt;
}

/// `text` as a message quotes it: at most `max_chars` characters, then "..." and the whole length in bytes; bytes
/// that are not UTF-8, and control characters, written as \xNN. A message then stays one short readable line
/// whatever the input holds (an 8 MB cell, a line break, a Latin-1 byte).
inline std::string excerpt(std::string_view text, std::size_t max_chars = 80) {
  std::string out;
  std::size_t chars = 0, i = 0;
  for (; i < text.size() && chars < max_chars; ++chars) {
    const auto n = detail::utf8_sequence_at(text, i);
    const auto b = static_cast<unsigned char>(text[i]);
    if (n == 0 || b < 0x20 || b == 0x7F) {
      out += fmt::format("\\x{:02X}", b);
      ++i;
    } else {
      out.append(text.substr(i, n));
      i += n;
    }
  }
  if (i < text.size()) out += fmt::format("... ({} bytes)", text.size());
  return out;
}

/// `texts` as a message lists them (fmt::join): each as excerpt() quotes it, the first `max_items` of them, then
/// "... (N in all)" when there are more (a CSV file of 100,000 columns still makes a short message).
inline std::vector<std::string> excerpts(const std::vector<std::string>& texts, std::size_t max_chars = 80,
                                         std::size_t max_items = 20) {
  std::vector<std::string> out;
  for (std::size_t i = 0; i < texts.size() && i < max_items; ++i) out.push_back(excerpt(texts[i], max_chars));
  if (texts.size() > max_items) out.push_back(fmt::format("... ({} in all)", texts.size()));
  return out;
}

/// DataError unless `text` is valid UTF-8, naming it: "<what> '<excerpt>' is not valid UTF-8 (byte 0xNN at offset
/// K); fastlearn writes names as UTF-8 into checkpoints, logs and predictions: <fix>".
inline void require_utf8(std::string_view text, const std::string& what, std::string_view fix) {
  const auto at = invalid_utf8_at(text);
  if (!at) return;
  throw DataError(
      fmt::format("{} '{}' is not valid UTF-8 (byte 0x{:02X} at offset {}); fastlearn writes names as "
                  "UTF-8 into checkpoints, logs and predictions: {}",
                  what, excerpt(text), static_cast<unsigned char>(text[*at]), *at, fix));
}

}  // namespace fastlearn
