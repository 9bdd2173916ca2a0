#include <fastlearn/config/detail/byte_path.h>

#include <fastlearn/core/detail/text.h>

#include <fmt/format.h>

namespace fastlearn {

namespace {
constexpr char kByteForm = '\0';

int hex_digit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  return -1;
}
}  // namespace

std::string path_to_config_text(std::string_view path) {
  if (!invalid_utf8_at(path) && path.find(kByteForm) == std::string_view::npos) return std::string(path);
  std::string out(1, kByteForm);
  for (std::size_t i = 0; i < path.size();) {
    const auto n = detail::utf8_sequence_at(path, i);
    const auto byte = static_cast<unsigned char>(path[i]);
    if (n == 0 || byte < 0x20 || byte == 0x7F || byte == '%') {
      out += fmt::format("%{:02X}", byte);
      ++i;
    } else {
      out.append(path.substr(i, n));
      i += n;
    }
  }
  return out;
}

std::optional<std::string> path_from_config_text(std::string_view text, std::string& why) {
  const auto nul = text.find(kByteForm, 1);
  if (nul != std::string_view::npos) {
    why = fmt::format("holds a U+0000 at character {}; a path has no NUL (only fastlearn's byte form starts with one)",
                      nul);
    return std::nullopt;
  }
  if (text.empty() || text.front() != kByteForm) return std::string(text);
  std::string out;
  for (std::size_t i = 1; i < text.size(); ++i) {
    if (text[i] != '%') {
      out += text[i];
      continue;
    }
    const int hi = i + 2 < text.size() ? hex_digit(text[i + 1]) : -1;
    const int lo = hi >= 0 ? hex_digit(text[i + 2]) : -1;
    if (lo < 0) {
      why = fmt::format(
          "is a path in fastlearn's byte form (it starts with \"\\u0000\"), whose '%' at character {} is not "
          "followed by two hex digits; write a byte as %XX and '%' itself as %25",
          i);
      return std::nullopt;
    }
    const auto byte = static_cast<char>(hi * 16 + lo);
    if (byte == kByteForm) {
      why = "is a path in fastlearn's byte form (it starts with \"\\u0000\") that holds %00; a path has no NUL byte";
      return std::nullopt;
    }
    out += byte;
    i += 2;
  }
  return out;
}

}  // namespace fastlearn
