#include <fastlearn/core/detail/safetensors_header.h>

#include <fastlearn/core/detail/text.h>
#include <fastlearn/core/error.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <bit>
#include <limits>
#include <optional>
#include <set>

namespace fastlearn::safetensors_detail {
namespace {

using Json = nlohmann::json;  // sorted keys: the reader restores the order from the data offsets

// The reference implementation refuses headers above 100 MB too; real headers are kilobytes.
constexpr std::uint64_t kMaxHeaderBytes = 100'000'000;
constexpr std::uint64_t kMaxInt64 = std::numeric_limits<std::int64_t>::max();

constexpr std::array<DType, 10> kDTypes{{{"F64", at::kDouble, 8},
                                         {"F32", at::kFloat, 4},
                                         {"F16", at::kHalf, 2},
                                         {"BF16", at::kBFloat16, 2},
                                         {"I64", at::kLong, 8},
                                         {"I32", at::kInt, 4},
                                         {"I16", at::kShort, 2},
                                         {"I8", at::kChar, 1},
                                         {"U8", at::kByte, 1},
                                         {"BOOL", at::kBool, 1}}};

Json parse_json(std::string_view text, std::string_view origin) {
  std::set<std::string> keys;        // of the root object
  std::set<std::string> entry_keys;  // of the entry being parsed
  std::string entry;                 // its name
  // The DOM parser keeps the last of duplicate keys silently, and deep nesting only costs memory: both
  // are refused here. The format nests root > entry > shape/data_offsets, i.e. containers at depth 0 to 2.
  auto check = [&](int depth, Json::parse_event_t event, Json& parsed) {
    if (event == Json::parse_event_t::object_start || event == Json::parse_event_t::array_start) {
      if (depth > 2) {
        fail(origin, fmt::format("the header nests JSON containers {} deep; the format has 3 levels", depth + 1));
      }
      if (depth == 1) entry_keys.clear();
    } else if (event == Json::parse_event_t::key && depth == 1) {
      entry = parsed.get<std::string>();
      if (!keys.insert(entry).second) fail(origin, fmt::format("the header has the key '{}' twice", excerpt(entry)));
    } else if (event == Json::parse_event_t::key && depth == 2) {
      const auto& key = parsed.get_ref<const std::string&>();
      if (!entry_keys.insert(key).second) {
        fail(origin, fmt::format("the header entry '{}' has the key '{}' twice", excerpt(entry), excerpt(key)));
      }
    }
    return true;
  };
  try {
    return Json::parse(text.begin(), text.end(), check, /*allow_exceptions=*/true, /*ignore_comments=*/false);
  } catch (const Json::parse_error& e) {
    const std::uint64_t at = e.byte > 0 ? e.byte - 1 : 0;  // nlohmann counts from 1
    fail(origin, fmt::format("invalid JSON header at byte {} of the file (byte {} of the header): {}",
                             kLengthBytes + at, at, excerpt(e.what(), 256)));
  } catch (const Json::exception& e) {
    fail(origin, fmt::format("invalid JSON header: {}", excerpt(e.what(), 256)));
  }
}

// A non-negative integer of at most 2^63 - 1, or nullopt.
std::optional<std::uint64_t> as_size(const Json& value) {
  if (value.is_number_unsigned()) {
    const auto v = value.get<std::uint64_t>();
    if (v <= kMaxInt64) return v;
  } else if (value.is_number_integer()) {
    const auto v = value.get<std::int64_t>();
    if (v >= 0) return static_cast<std::uint64_t>(v);
  }
  return std::nullopt;
}

const Json& field(const Json& entry, const std::string& tensor, const char* key, std::string_view origin) {
  const auto it = entry.find(key);
  if (it == entry.end()) fail(origin, fmt::format("header entry for tensor '{}' has no \"{}\"", excerpt(tensor), key));
  return *it;
}

Entry parse_entry(const std::string& name, const Json& value, const Header& header, std::string_view origin) {
  if (!value.is_object()) {
    fail(origin, fmt::format("header entry for tensor '{}' is a JSON {}, not an object with dtype, shape and "
                             "data_offsets",
                             excerpt(name), value.type_name()));
  }
  Entry entry{.name = name};
  const Json& dtype = field(value, name, "dtype", origin);
  if (!dtype.is_string()) {
    fail(origin, fmt::format("dtype of tensor '{}' is a JSON {}, not a string", excerpt(name), dtype.type_name()));
  }
  entry.dtype = dtype_by_name(dtype.get_ref<const std::string&>());
  if (!entry.dtype) {
    fail(origin, fmt::format("unknown dtype '{}' for tensor '{}' (supported: {})",
                             excerpt(dtype.get_ref<const std::string&>()), excerpt(name), dtype_names()));
  }

  const Json& shape = field(value, name, "shape", origin);
  if (!shape.is_array()) {
    fail(origin, fmt::format("shape of tensor '{}' is a JSON {}, not an array", excerpt(name), shape.type_name()));
  }
  // `extent` counts zero dimensions as one: bounding it also keeps torch's strides from overflowing.
  std::uint64_t extent = entry.dtype->size;
  std::uint64_t numel = 1;
  for (std::size_t i = 0; i < shape.size(); ++i) {
    const auto dim = as_size(shape[i]);
    if (!dim) {
      fail(origin, fmt::format("shape {} of tensor '{}' has {} at index {}; dimensions are integers from 0 to 2^63-1",
                               excerpt(shape.dump()), excerpt(name), excerpt(shape[i].dump()), i));
    }
    if (*dim > 1 && extent > kMaxInt64 / *dim) {
      fail(origin,
           fmt::format("shape {} of tensor '{}' describes more than 2^63 bytes", excerpt(shape.dump()), excerpt(name)));
    }
    extent *= std::max<std::uint64_t>(*dim, 1);
    numel *= *dim;
    entry.shape.push_back(static_cast<std::int64_t>(*dim));
  }
  const std::uint64_t bytes = numel * entry.dtype->size;

  const Json& offsets = field(value, name, "data_offsets", origin);
  const auto begin = offsets.is_array() && offsets.size() == 2 ? as_size(offsets[0]) : std::nullopt;
  const auto end = offsets.is_array() && offsets.size() == 2 ? as_size(offsets[1]) : std::nullopt;
  if (!begin || !end) {
    fail(origin, fmt::format("data_offsets of tensor '{}' are {}, not [begin, end] with integers from 0 to 2^63-1",
                             excerpt(name), excerpt(offsets.dump())));
  }
  entry.begin = *begin;
  entry.end = *end;
  if (entry.begin > entry.end) {
    fail(origin,
         fmt::format("tensor '{}' data_offsets [{}, {}] end before they begin", excerpt(name), entry.begin, entry.end));
  }
  if (entry.end > header.data_size) {
    fail(origin, fmt::format("tensor '{}' data_offsets [{}, {}] exceed the data buffer of {} bytes (byte offset {} in "
                             "the file, which has {} bytes); the file is truncated or its header is corrupt",
                             excerpt(name), entry.begin, entry.end, header.data_size, file_offset(header, entry.end),
                             header.data_start + header.data_size));
  }
  if (entry.end - entry.begin != bytes) {
    fail(origin, fmt::format("shape {} of tensor '{}' ({}) needs {} bytes but data_offsets [{}, {}] span {}",
                             excerpt(shape.dump()), excerpt(name), entry.dtype->name, bytes, entry.begin, entry.end,
                             entry.end - entry.begin));
  }
  return entry;
}

Metadata parse_metadata(const Json& value, std::string_view origin) {
  if (!value.is_object()) {
    fail(origin, fmt::format("__metadata__ is a JSON {}, not an object of strings", value.type_name()));
  }
  Metadata metadata;
  for (const auto& [key, item] : value.items()) {
    if (!item.is_string()) {
      fail(origin, fmt::format("__metadata__ key '{}' has a JSON {} value; metadata values must be strings",
                               excerpt(key), item.type_name()));
    }
    metadata.emplace(key, item.get<std::string>());
  }
  return metadata;
}

}  // namespace

std::string_view dtype_names() { return "F64, F32, F16, BF16, I64, I32, I16, I8, U8, BOOL"; }

const DType* dtype_by_name(std::string_view name) {
  for (const auto& t : kDTypes)
    if (t.name == name) return &t;
  return nullptr;
}

const DType* dtype_by_type(at::ScalarType type) {
  for (const auto& t : kDTypes)
    if (t.type == type) return &t;
  return nullptr;
}

[[noreturn]] void fail(std::string_view origin, std::string_view message) {
  throw CheckpointError(fmt::format("{}: {}", excerpt(origin, 256), message));
}

// safetensors data is little-endian: reverse each element's bytes on big-endian hosts.
void swap_to_little_endian(void* data, std::int64_t count, std::uint64_t size) {
  if constexpr (std::endian::native == std::endian::little) return;
  auto* bytes = static_cast<std::uint8_t*>(data);
  if (size == 1) return;
  for (std::int64_t i = 0; i < count; ++i) std::reverse(bytes + i * size, bytes + (i + 1) * size);
}

// File offset of byte `offset` of the data buffer, as text (hostile offsets may not fit in 64 bits).
std::string file_offset(const Header& header, std::uint64_t offset) {
  if (offset > std::numeric_limits<std::uint64_t>::max() - header.data_start) return "beyond 2^64";
  return std::to_string(header.data_start + offset);
}

// Reads the header length N from the first 8 bytes and checks it against the file size.
std::uint64_t header_length(const unsigned char* prefix, std::uint64_t file_size, std::string_view origin) {
  std::uint64_t n = 0;
  for (std::uint64_t i = 0; i < kLengthBytes; ++i) n |= std::uint64_t{prefix[i]} << (8 * i);
  if (n > file_size - kLengthBytes) {
    fail(origin, fmt::format("header length {} at byte 0 exceeds the file size {} (at most {} bytes follow the "
                             "8-byte length); the file is truncated or not a safetensors file",
                             n, file_size, file_size - kLengthBytes));
  }
  if (n > kMaxHeaderBytes) {
    fail(origin, fmt::format("header length {} at byte 0 exceeds the limit of {} bytes", n, kMaxHeaderBytes));
  }
  return n;
}

// Parses and validates the JSON header `text` of a file of `file_size` bytes.
Header parse_header(std::string_view text, std::uint64_t file_size, std::string_view origin) {
  Header header;
  header.data_start = kLengthBytes + text.size();
  header.data_size = file_size - header.data_start;
  const Json json = parse_json(text, origin);
  if (!json.is_object())
    fail(origin, fmt::format("the header at byte 8 is a JSON {}, not an object", json.type_name()));
  for (const auto& [name, value] : json.items()) {
    if (name == kMetadataKey) {
      header.metadata = parse_metadata(value, origin);
    } else {
      header.entries.push_back(parse_entry(name, value, header, origin));
    }
  }

  // The tensors must tile the data buffer: sorted by offset, each begins where the previous one ends.
  std::stable_sort(header.entries.begin(), header.entries.end(), [](const Entry& a, const Entry& b) {
    return std::pair(a.begin, a.end) < std::pair(b.begin, b.end);
  });
  std::uint64_t covered = 0;
  const Entry* previous = nullptr;
  for (const auto& entry : header.entries) {
    if (entry.begin > covered && previous) {
      fail(origin, fmt::format("gap of {} bytes in the data buffer between tensor '{}' (data_offsets [{}, {}]) and "
                               "tensor '{}' (data_offsets [{}, {}]), at byte offset {} in the file",
                               entry.begin - covered, excerpt(previous->name), previous->begin, previous->end,
                               excerpt(entry.name), entry.begin, entry.end, file_offset(header, covered)));
    }
    if (entry.begin > covered) {
      fail(origin, fmt::format("gap of {} bytes at the start of the data buffer, before tensor '{}' (data_offsets "
                               "[{}, {}]), at byte offset {} in the file",
                               entry.begin, excerpt(entry.name), entry.begin, entry.end, file_offset(header, 0)));
    }
    if (entry.begin < covered) {
      fail(origin, fmt::format("tensor '{}' (data_offsets [{}, {}]) overlaps tensor '{}' (data_offsets [{}, {}]) at "
                               "byte offset {} in the file",
                               excerpt(entry.name), entry.begin, entry.end, excerpt(previous->name), previous->begin,
                               previous->end, file_offset(header, entry.begin)));
    }
    covered = entry.end;
    previous = &entry;
  }
  if (covered != header.data_size) {
    fail(origin,
         fmt::format("the last {} byte(s) of the data buffer, from byte offset {} in the file, belong to no "
                     "tensor{}",
                     header.data_size - covered, file_offset(header, covered),
                     previous ? fmt::format("; the last tensor is '{}'", excerpt(previous->name)) : std::string()));
  }
  return header;
}

}  // namespace fastlearn::safetensors_detail
