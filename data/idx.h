#pragma once
// The IDX format of (Fashion-)MNIST: a 4-byte magic (0, 0, element type, rank), big-endian int32
// dimensions, then the big-endian elements. Files may be gzip-compressed or raw.
#include <ATen/core/Tensor.h>

#include <filesystem>
#include <string_view>

namespace fastlearn {

/// Reads an IDX file (gzip or raw) into a tensor of its element type and shape. A bad magic, an
/// unreasonable shape, a truncated or corrupt file, or trailing bytes are a DataError naming the file
/// and the byte offset (in the uncompressed stream).
at::Tensor read_idx(const std::filesystem::path& path);
/// read_idx for bytes in memory (gzip-compressed or raw); errors name `origin`.
at::Tensor parse_idx(std::string_view bytes, std::string_view origin);

/// Writes `tensor` (uint8, int8, int16, int32, float32 or float64; rank 1..255) as IDX, gzip-compressed
/// when `path` ends in ".gz". Written to a temporary name and renamed, so readers never see half a file.
void write_idx(const std::filesystem::path& path, const at::Tensor& tensor);

}  // namespace fastlearn
