#pragma once
// The safetensors format (Hugging Face): an 8-byte little-endian header length N, N bytes of JSON naming
// each tensor's dtype, shape and [begin, end) byte range in the data buffer that follows, plus an optional
// "__metadata__" object of strings. Data is little-endian and row-major; the tensors tile the buffer exactly.
// Dtypes: F64 F32 F16 BF16 I64 I32 I16 I8 U8 BOOL.
#include <fastlearn/core/named_tensors.h>

#include <ATen/core/Tensor.h>

#include <filesystem>
#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace fastlearn {

/// The "__metadata__" of a safetensors file: string keys to string values.
using Metadata = std::map<std::string, std::string>;

/// What a safetensors file holds. Loaded tensors are CPU tensors that own their memory.
struct SafetensorsContent {
  NamedTensors tensors;
  Metadata metadata;

  /// The tensor called `name`, or nullptr.
  const at::Tensor* find(std::string_view name) const;
};

/// Serializes `tensors` (any device, any strides; written as contiguous CPU data, in the given order) and
/// `metadata`. Duplicate names, the reserved name "__metadata__", undefined or non-strided tensors,
/// unsupported dtypes and strings that are not UTF-8 are a CheckpointError naming the tensor.
std::string serialize_safetensors(const NamedTensors& tensors, const Metadata& metadata = {});

/// Parses a whole safetensors file held in memory; `origin` (a file name) prefixes every error message.
/// Any malformed input is a CheckpointError naming the tensor and/or byte offset at fault; memory use is
/// bounded by the size of `bytes`.
SafetensorsContent parse_safetensors(std::string_view bytes, std::string_view origin);

/// The metadata key of per-tensor checksums: the CRC-32 of each tensor's bytes as stored, 8 hex digits each,
/// space-separated, in the order of the data buffer. Readers of the format ignore it; load_safetensors and
/// parse_safetensors check a file that has it, so a flipped bit or an overwritten range is an error naming the
/// tensor instead of weights that load.
inline constexpr std::string_view kChecksumKey = "fastlearn.crc32";

/// `metadata` with kChecksumKey set for `tensors` (written in this order by save_safetensors).
Metadata with_checksums(const NamedTensors& tensors, Metadata metadata);

/// serialize_safetensors into `path`, atomically (write_file_atomically): readers see the old file or the
/// complete new one. Failures are a CheckpointError.
void save_safetensors(const std::filesystem::path& path, const NamedTensors& tensors, const Metadata& metadata = {});

/// save_safetensors with `metadata` as with_checksums gives it, each tensor copied to host memory (where it is
/// on a GPU, or not contiguous) once for both: what checkpoints use.
void save_checked_safetensors(const std::filesystem::path& path, const NamedTensors& tensors, Metadata metadata = {});

/// A tensor that a streamed save makes only when it reaches it: its name, dtype and shape up front.
struct DeferredTensor {
  std::string name;
  at::ScalarType dtype = at::kFloat;
  std::vector<std::int64_t> shape;
  std::function<at::Tensor()> make;  ///< called once, in order; gives a tensor of that dtype and shape
};

/// save_checked_safetensors of `tensors`, in order, each made only when the writer reaches it and dropped once its
/// bytes are written and summed, so that at most one made tensor is in memory at a time. The header holds the
/// checksums: they are written into a placeholder of the same length (8 hex digits each) once all are known. With
/// `write` false every tensor is made, in order, and nothing is written: what the other processes of a save do when a
/// make() is a collective (a sharded optimizer's state gathered from every process).
void save_checked_safetensors(const std::filesystem::path& path, const std::vector<DeferredTensor>& tensors,
                              Metadata metadata, bool write = true);

/// Loads a safetensors file, reading each tensor's bytes straight into its own storage. Errors are a
/// CheckpointError naming the file, as parse_safetensors.
SafetensorsContent load_safetensors(const std::filesystem::path& path);

/// The metadata of a safetensors file, from its header alone (the tensors are not read). Errors as
/// load_safetensors.
Metadata load_safetensors_metadata(const std::filesystem::path& path);

}  // namespace fastlearn
