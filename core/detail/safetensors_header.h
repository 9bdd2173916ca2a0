#pragma once
// Internal to core/safetensors.cpp: the safetensors dtype table and the validating header parser (every
// offset, shape and dtype of a hostile file is checked here before anything is allocated).
#include <fastlearn/core/safetensors.h>

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace fastlearn::safetensors_detail {

inline constexpr std::uint64_t kLengthBytes = 8;
inline constexpr std::string_view kMetadataKey = "__metadata__";

struct DType {
  std::string_view name;
  at::ScalarType type;
  std::uint64_t size;
};

/// The entry of a safetensors dtype name ("F32") or of an ATen type; nullptr when the format has none.
const DType* dtype_by_name(std::string_view name);
const DType* dtype_by_type(at::ScalarType type);
/// The names of every dtype, for errors.
std::string_view dtype_names();

/// CheckpointError "<origin>: <message>".
[[noreturn]] void fail(std::string_view origin, std::string_view message);
/// safetensors data is little-endian: reverses each element's bytes on big-endian hosts.
void swap_to_little_endian(void* data, std::int64_t count, std::uint64_t size);

/// One tensor of a parsed header, its data at [begin, end) of the data buffer.
struct Entry {
  std::string name;
  const DType* dtype = nullptr;
  std::vector<std::int64_t> shape;
  std::uint64_t begin = 0;
  std::uint64_t end = 0;
};

/// A validated header: the entries in data buffer order, tiling [0, data_size) exactly.
struct Header {
  std::vector<Entry> entries;
  Metadata metadata;
  std::uint64_t data_start = 0;  ///< file offset of the data buffer
  std::uint64_t data_size = 0;
};

/// Reads the header length N from the first 8 bytes and checks it against the file size.
std::uint64_t header_length(const unsigned char* prefix, std::uint64_t file_size, std::string_view origin);
/// Parses and validates the JSON header `text` of a file of `file_size` bytes.
Header parse_header(std::string_view text, std::uint64_t file_size, std::string_view origin);
/// File offset of byte `offset` of the data buffer, as text (hostile offsets may not fit in 64 bits).
std::string file_offset(const Header& header, std::uint64_t offset);

}  // namespace fastlearn::safetensors_detail
