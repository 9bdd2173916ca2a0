#pragma once
// How a config file holds a path that is not UTF-8 (a Latin-1 folder name), which no TOML string can hold: the
// value starts with U+0000 (written "\u0000", which no path can contain) and the rest is the path with each byte
// that is not part of valid UTF-8, each control character and each '%' written as %XX: "\u0000runs/caf%E9" is the
// bytes "runs/caf\xE9". A value without that first character is the path as written, '%' included.
#include <optional>
#include <string>
#include <string_view>

namespace fastlearn {

/// `path` as a config value: itself when it is UTF-8 without a U+0000, the byte form otherwise.
std::string path_to_config_text(std::string_view path);

/// The path a config value names: the value itself, or the bytes of its byte form; nothing (and `why`) when a byte
/// form has a '%' without two hex digits after it, or decodes to a U+0000.
std::optional<std::string> path_from_config_text(std::string_view text, std::string& why);

}  // namespace fastlearn
