#pragma once
// NumPy's .npy format (version 1.0, 2.0 and 3.0): the magic "\x93NUMPY", a version, a little-endian header length,
// a Python dict literal {'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), } padded with spaces and a
// newline, then the elements. What numpy.save writes, what `fastlearn predict` reads and writes for tensor models.
#include <ATen/core/Tensor.h>

#include <filesystem>
#include <string_view>

namespace fastlearn {

/// Reads a .npy file into a CPU tensor of its shape: float16/32/64, int8/16/32/64, uint8, uint16 and uint32 (as
/// int32 and int64), or bool; little or big endian; C or Fortran order (the tensor is row-major either way). An object
/// array, a structured dtype, a header that is not the format's, a shape whose element count overflows or does not
/// match the file's size, and trailing bytes are a DataError naming the file; nothing is allocated before the size is
/// checked.
at::Tensor read_npy(const std::filesystem::path& path);
/// read_npy for bytes in memory; errors name `origin`.
at::Tensor parse_npy(std::string_view bytes, std::string_view origin);

/// `tensor` (float32, float64, int8/16/32/64, uint8 or bool, any shape) as .npy version 1.0 bytes, little endian, C
/// order, as numpy.save writes it.
std::string serialize_npy(const at::Tensor& tensor);
/// serialize_npy into `path`, atomically (readers never see half a file).
void write_npy(const std::filesystem::path& path, const at::Tensor& tensor);

}  // namespace fastlearn
