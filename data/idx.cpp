#include <fastlearn/data/idx.h>

#include <fastlearn/core/error.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/torch.h>
#include <zlib.h>

#include <array>
#include <bit>
#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <vector>

namespace fastlearn {
namespace {

constexpr int kMaxRank = 16;                         // real IDX files have rank 1 to 4
constexpr std::int64_t kMaxBytes = std::int64_t{1} << 36;  // 64 GiB: anything larger is a corrupt header

struct ElementType {
  std::uint8_t code;
  at::ScalarType dtype;
  int size;
};

constexpr std::array<ElementType, 6> kTypes{{{0x08, at::kByte, 1},
                                             {0x09, at::kChar, 1},
                                             {0x0B, at::kShort, 2},
                                             {0x0C, at::kInt, 4},
                                             {0x0D, at::kFloat, 4},
                                             {0x0E, at::kDouble, 8}}};

std::optional<ElementType> type_by_code(std::uint8_t code) {
  for (const auto& t : kTypes)
    if (t.code == code) return t;
  return std::nullopt;
}

std::optional<ElementType> type_by_dtype(at::ScalarType dtype) {
  for (const auto& t : kTypes)
    if (t.dtype == dtype) return t;
  return std::nullopt;
}

// IDX is big-endian; reverse each element's bytes on little-endian hosts.
void swap_to_host(std::uint8_t* data, std::int64_t count, int size) {
  if constexpr (std::endian::native == std::endian::big) return;
  if (size == 1) return;
  for (std::int64_t i = 0; i < count; ++i) std::reverse(data + i * size, data + (i + 1) * size);
}

struct GzCloser {
  void operator()(gzFile f) const { gzclose(f); }
};
using GzFile = std::unique_ptr<gzFile_s, GzCloser>;

// Reads through zlib, which passes uncompressed files through unchanged; tracks the offset for errors.
class IdxSource {
 public:
  explicit IdxSource(const std::filesystem::path& path) : path_(path), file_(gzopen(path.c_str(), "rb")) {
    if (!file_) throw DataError(fmt::format("cannot open IDX file '{}': {}", path.string(), std::strerror(errno)));
    gzbuffer(file_.get(), 1 << 20);
  }

  // Reads exactly `n` bytes or throws, describing `what` was expected at the current offset.
  void read_exact(void* out, std::int64_t n, std::string_view what) {
    auto* dst = static_cast<std::uint8_t*>(out);
    std::int64_t done = 0;
    while (done < n) {
      const auto chunk = static_cast<unsigned>(std::min<std::int64_t>(n - done, 1 << 30));
      const int got = gzread(file_.get(), dst + done, chunk);
      if (got < 0) corrupt();
      if (got == 0) {
        throw DataError(fmt::format("IDX file '{}' is truncated at byte offset {}: expected {} more byte(s) of {}",
                                    path_.string(), offset_ + done, n - done, what));
      }
      done += got;
    }
    offset_ += n;
  }

  void expect_end() {
    std::uint8_t extra = 0;
    const int got = gzread(file_.get(), &extra, 1);
    if (got < 0) corrupt();
    if (got > 0) {
      throw DataError(fmt::format("IDX file '{}' has unexpected bytes after the data, at byte offset {}",
                                  path_.string(), offset_));
    }
  }

  std::int64_t offset() const { return offset_; }
  const std::filesystem::path& path() const { return path_; }

 private:
  [[noreturn]] void corrupt() {
    int code = Z_OK;
    const char* message = gzerror(file_.get(), &code);
    throw DataError(fmt::format("IDX file '{}' is corrupt near byte offset {}: {}", path_.string(), offset_,
                                message ? message : "decompression failed"));
  }

  std::filesystem::path path_;
  GzFile file_;
  std::int64_t offset_ = 0;
};

}  // namespace

at::Tensor read_idx(const std::filesystem::path& path) {
  IdxSource source(path);
  std::array<std::uint8_t, 4> magic{};
  source.read_exact(magic.data(), 4, "the IDX magic number");
  const auto type = type_by_code(magic[2]);
  if (magic[0] != 0 || magic[1] != 0 || !type) {
    throw DataError(fmt::format("'{}' is not an IDX file: bad magic {:02x} {:02x} {:02x} {:02x} at byte offset 0 "
                                "(expected 00 00, then a type of 08/09/0b/0c/0d/0e, then the rank)",
                                path.string(), magic[0], magic[1], magic[2], magic[3]));
  }
  const int rank = magic[3];
  if (rank < 1 || rank > kMaxRank) {
    throw DataError(fmt::format("IDX file '{}' declares rank {} at byte offset 3; expected 1 to {}", path.string(),
                                rank, kMaxRank));
  }
  std::vector<std::int64_t> shape(rank);
  std::int64_t bytes = type->size;
  for (int d = 0; d < rank; ++d) {
    std::array<std::uint8_t, 4> be{};
    const std::int64_t at = source.offset();
    source.read_exact(be.data(), 4, fmt::format("dimension {}", d));
    const std::uint32_t dim = (std::uint32_t{be[0]} << 24) | (std::uint32_t{be[1]} << 16) |
                              (std::uint32_t{be[2]} << 8) | std::uint32_t{be[3]};
    if (dim > static_cast<std::uint32_t>(std::numeric_limits<std::int32_t>::max())) {
      throw DataError(fmt::format("IDX file '{}': dimension {} at byte offset {} is {}, which is negative as int32",
                                  path.string(), d, at, dim));
    }
    shape[d] = dim;
    if (dim != 0 && bytes > kMaxBytes / static_cast<std::int64_t>(dim)) {
      throw DataError(fmt::format("IDX file '{}': dimensions up to offset {} describe more than {} bytes; the header "
                                  "is corrupt", path.string(), at, kMaxBytes));
    }
    bytes *= dim;
  }
  auto tensor = torch::empty(shape, torch::TensorOptions().dtype(type->dtype));
  auto* data = static_cast<std::uint8_t*>(tensor.data_ptr());
  source.read_exact(data, bytes, fmt::format("element data for shape {}", fmt::join(shape, "x")));
  source.expect_end();
  swap_to_host(data, tensor.numel(), type->size);
  return tensor;
}

void write_idx(const std::filesystem::path& path, const at::Tensor& tensor) {
  const auto type = type_by_dtype(tensor.scalar_type());
  if (!type) {
    throw DataError(fmt::format("write_idx('{}'): dtype {} has no IDX code; use uint8, int8, int16, int32, float32 "
                                "or float64", path.string(), c10::toString(tensor.scalar_type())));
  }
  if (tensor.dim() < 1 || tensor.dim() > 255) {
    throw DataError(fmt::format("write_idx('{}'): rank {} is outside 1..255", path.string(), tensor.dim()));
  }
  std::vector<std::uint8_t> out{0, 0, type->code, static_cast<std::uint8_t>(tensor.dim())};
  for (auto dim : tensor.sizes()) {
    const auto d = static_cast<std::uint32_t>(dim);
    out.insert(out.end(), {static_cast<std::uint8_t>(d >> 24), static_cast<std::uint8_t>(d >> 16),
                           static_cast<std::uint8_t>(d >> 8), static_cast<std::uint8_t>(d)});
  }
  const auto header = static_cast<std::int64_t>(out.size());
  auto contiguous = tensor.to(torch::kCPU).contiguous();
  const auto* src = static_cast<const std::uint8_t*>(contiguous.data_ptr());
  out.insert(out.end(), src, src + contiguous.nbytes());
  swap_to_host(out.data() + header, contiguous.numel(), type->size);

  const bool gzip = path.extension() == ".gz";
  auto temp = path;
  temp += ".partial";
  {
    GzFile file(gzopen(temp.c_str(), gzip ? "wb6" : "wbT"));  // "T": plain, uncompressed output
    if (!file) throw DataError(fmt::format("cannot write '{}': {}", temp.string(), std::strerror(errno)));
    std::int64_t done = 0;
    while (done < static_cast<std::int64_t>(out.size())) {
      const auto chunk = static_cast<unsigned>(std::min<std::int64_t>(out.size() - done, 1 << 30));
      if (gzwrite(file.get(), out.data() + done, chunk) != static_cast<int>(chunk)) {
        std::filesystem::remove(temp);
        throw DataError(fmt::format("writing '{}' failed at byte offset {}", temp.string(), done));
      }
      done += chunk;
    }
    if (gzclose(file.release()) != Z_OK) {
      std::filesystem::remove(temp);
      throw DataError(fmt::format("writing '{}' failed when closing it", temp.string()));
    }
  }
  std::filesystem::rename(temp, path);
}

}  // namespace fastlearn
