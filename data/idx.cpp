#include <fastlearn/data/idx.h>

#include <fastlearn/core/detail/text.h>
#include <fastlearn/core/error.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/torch.h>
#include <zlib.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <optional>
#include <vector>

namespace fastlearn {
namespace {

constexpr int kMaxRank = 16;                                  // real IDX files have rank 1 to 4
constexpr std::int64_t kMaxBytes = std::int64_t{1} << 36;     // 64 GiB: anything larger is a corrupt header
constexpr std::int64_t kDirectBytes = std::int64_t{1} << 20;  // 1 MiB: read straight into the tensor up to this
constexpr std::int64_t kMaxChunk = std::int64_t{1} << 26;     // 64 MiB: the largest step of a bigger read

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

// Where the bytes of an IDX stream come from: read() gives up to n bytes, 0 at the end, or throws.
class ByteSource {
 public:
  virtual ~ByteSource() = default;
  virtual std::int64_t read(std::uint8_t* out, std::int64_t n, std::int64_t offset) = 0;
};

// A file through zlib, which passes uncompressed files through unchanged.
class GzFileSource : public ByteSource {
 public:
  GzFileSource(const std::filesystem::path& path, std::string_view name)
      : name_(name), file_(gzopen(path.c_str(), "rb")) {
    if (!file_)
      throw DataError(fmt::format("cannot open IDX file '{}': {}", excerpt(name_, 256), std::strerror(errno)));
    gzbuffer(file_.get(), 1 << 20);
  }
  std::int64_t read(std::uint8_t* out, std::int64_t n, std::int64_t offset) override {
    const int got = gzread(file_.get(), out, static_cast<unsigned>(std::min<std::int64_t>(n, 1 << 30)));
    if (got < 0) {
      int code = Z_OK;
      const char* message = gzerror(file_.get(), &code);
      throw DataError(fmt::format("IDX file '{}' is corrupt near byte offset {}: {}", excerpt(name_, 256), offset,
                                  message ? message : "decompression failed"));
    }
    return got;
  }

 private:
  std::string name_;
  GzFile file_;
};

// Bytes in memory: gzip (by its magic) inflated on the fly, anything else as it is.
class MemorySource : public ByteSource {
 public:
  MemorySource(std::string_view bytes, std::string_view name) : name_(name), bytes_(bytes) {
    gzip_ = bytes.size() >= 2 && static_cast<unsigned char>(bytes[0]) == 0x1f &&
            static_cast<unsigned char>(bytes[1]) == 0x8b;
    if (!gzip_) return;
    if (inflateInit2(&stream_, 15 + 16) != Z_OK)
      throw DataError(fmt::format("IDX '{}': zlib init failed", excerpt(name_, 256)));
    stream_.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(bytes.data()));
    stream_.avail_in = static_cast<uInt>(std::min<std::size_t>(bytes.size(), std::numeric_limits<uInt>::max()));
  }
  ~MemorySource() override {
    if (gzip_) inflateEnd(&stream_);
  }
  MemorySource(const MemorySource&) = delete;
  MemorySource& operator=(const MemorySource&) = delete;

  std::int64_t read(std::uint8_t* out, std::int64_t n, std::int64_t offset) override {
    if (!gzip_) {
      const auto got = std::min<std::int64_t>(n, static_cast<std::int64_t>(bytes_.size() - position_));
      std::memcpy(out, bytes_.data() + position_, static_cast<std::size_t>(got));
      position_ += static_cast<std::size_t>(got);
      return got;
    }
    if (ended_) return 0;
    stream_.next_out = out;
    stream_.avail_out = static_cast<uInt>(std::min<std::int64_t>(n, 1 << 30));
    const auto before = stream_.avail_out;
    while (stream_.avail_out == before) {  // inflate may consume input (headers) without output
      const int code = inflate(&stream_, Z_NO_FLUSH);
      if (code == Z_STREAM_END) {
        ended_ = true;
        break;
      }
      if (code == Z_BUF_ERROR && stream_.avail_in == 0) break;  // the input ended early: the caller reports it
      if (code != Z_OK) {
        throw DataError(fmt::format("IDX '{}' is corrupt near byte offset {}: {}", excerpt(name_, 256), offset,
                                    stream_.msg ? stream_.msg : "decompression failed"));
      }
      if (stream_.avail_in == 0 && stream_.avail_out == before) break;
    }
    return before - stream_.avail_out;
  }

 private:
  std::string name_;
  std::string_view bytes_;
  std::size_t position_ = 0;
  bool gzip_ = false;
  bool ended_ = false;
  z_stream stream_{};
};

// Reads exact byte counts from a source, tracking the offset for errors.
class IdxReader {
 public:
  IdxReader(ByteSource& source, std::string_view name) : source_(source), name_(name) {}

  // Reads exactly `n` bytes or throws, describing `what` was expected at the current offset.
  void read_exact(void* out, std::int64_t n, std::string_view what) {
    auto* dst = static_cast<std::uint8_t*>(out);
    std::int64_t done = 0;
    while (done < n) {
      const auto got = source_.read(dst + done, n - done, offset_ + done);
      if (got == 0) {
        throw DataError(fmt::format("IDX file '{}' is truncated at byte offset {}: expected {} more byte(s) of {}",
                                    excerpt(name_, 256), offset_ + done, n - done, what));
      }
      done += got;
    }
    offset_ += n;
  }

  void expect_end() {
    std::uint8_t extra = 0;
    if (source_.read(&extra, 1, offset_) > 0) {
      throw DataError(fmt::format("IDX file '{}' has unexpected bytes after the data, at byte offset {}",
                                  excerpt(name_, 256), offset_));
    }
  }

  std::int64_t offset() const { return offset_; }

 private:
  ByteSource& source_;
  std::string name_;
  std::int64_t offset_ = 0;
};

at::Tensor parse_idx_from(ByteSource& input, const std::string& name) {
  IdxReader source(input, name);
  std::array<std::uint8_t, 4> magic{};
  source.read_exact(magic.data(), 4, "the IDX magic number");
  const auto type = type_by_code(magic[2]);
  if (magic[0] != 0 || magic[1] != 0 || !type) {
    throw DataError(
        fmt::format("'{}' is not an IDX file: bad magic {:02x} {:02x} {:02x} {:02x} at byte offset 0 "
                    "(expected 00 00, then a type of 08/09/0b/0c/0d/0e, then the rank)",
                    excerpt(name, 256), magic[0], magic[1], magic[2], magic[3]));
  }
  const int rank = magic[3];
  if (rank < 1 || rank > kMaxRank) {
    throw DataError(fmt::format("IDX file '{}' declares rank {} at byte offset 3; expected 1 to {}", excerpt(name, 256),
                                rank, kMaxRank));
  }
  std::vector<std::int64_t> shape(rank);
  std::int64_t bytes = type->size;
  std::int64_t extent = type->size;
  for (int d = 0; d < rank; ++d) {
    std::array<std::uint8_t, 4> be{};
    const std::int64_t at = source.offset();
    source.read_exact(be.data(), 4, fmt::format("dimension {}", d));
    const std::uint32_t dim = (std::uint32_t{be[0]} << 24) | (std::uint32_t{be[1]} << 16) |
                              (std::uint32_t{be[2]} << 8) | std::uint32_t{be[3]};
    if (dim > static_cast<std::uint32_t>(std::numeric_limits<std::int32_t>::max())) {
      throw DataError(fmt::format("IDX file '{}': dimension {} at byte offset {} is {}, which is negative as int32",
                                  excerpt(name, 256), d, at, dim));
    }
    shape[d] = dim;
    // The extent ignores zero dimensions: torch rejects a shape whose other dimensions overflow even when
    // one is zero, and such a header is corrupt anyway.
    const std::int64_t factor = std::max<std::int64_t>(dim, 1);
    if (extent > kMaxBytes / factor) {
      throw DataError(
          fmt::format("IDX file '{}': dimensions up to offset {} describe more than {} bytes; the header "
                      "is corrupt",
                      excerpt(name, 256), at, kMaxBytes));
    }
    extent *= factor;
    bytes *= dim;
  }
  const auto what = fmt::format("element data for shape {}", fmt::join(shape, "x"));
  at::Tensor tensor;
  if (bytes <= kDirectBytes) {
    tensor = torch::empty(shape, torch::TensorOptions().dtype(type->dtype));
    source.read_exact(tensor.data_ptr(), bytes, what);
  } else {
    // A header can claim gigabytes that the file does not have: grow with the data actually read, so a
    // corrupt header is a truncation error, not an allocation of what it claims.
    std::vector<std::uint8_t> buffer;
    std::int64_t step = std::int64_t{1} << 20;  // 1 MiB, doubling: a short file costs little to reject
    while (static_cast<std::int64_t>(buffer.size()) < bytes) {
      const auto chunk = std::min<std::int64_t>(step, bytes - static_cast<std::int64_t>(buffer.size()));
      step = std::min(step * 2, kMaxChunk);
      const auto done = buffer.size();
      buffer.resize(done + static_cast<std::size_t>(chunk));
      source.read_exact(buffer.data() + done, chunk, what);
    }
    tensor = torch::from_blob(buffer.data(), shape, torch::TensorOptions().dtype(type->dtype)).clone();
  }
  source.expect_end();
  swap_to_host(static_cast<std::uint8_t*>(tensor.data_ptr()), tensor.numel(), type->size);
  return tensor;
}

}  // namespace

at::Tensor read_idx(const std::filesystem::path& path) {
  GzFileSource file(path, path.string());
  return parse_idx_from(file, path.string());
}

at::Tensor parse_idx(std::string_view bytes, std::string_view origin) {
  MemorySource memory(bytes, origin);
  return parse_idx_from(memory, std::string(origin));
}

void write_idx(const std::filesystem::path& path, const at::Tensor& tensor) {
  const auto type = type_by_dtype(tensor.scalar_type());
  if (!type) {
    throw DataError(
        fmt::format("write_idx('{}'): dtype {} has no IDX code; use uint8, int8, int16, int32, float32 "
                    "or float64",
                    excerpt(path.string(), 256), c10::toString(tensor.scalar_type())));
  }
  if (tensor.dim() < 1 || tensor.dim() > 255) {
    throw DataError(
        fmt::format("write_idx('{}'): rank {} is outside 1..255", excerpt(path.string(), 256), tensor.dim()));
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
    if (!file) throw DataError(fmt::format("cannot write '{}': {}", excerpt(temp.string(), 256), std::strerror(errno)));
    std::int64_t done = 0;
    while (done < static_cast<std::int64_t>(out.size())) {
      const auto chunk = static_cast<unsigned>(std::min<std::int64_t>(out.size() - done, 1 << 30));
      if (gzwrite(file.get(), out.data() + done, chunk) != static_cast<int>(chunk)) {
        std::filesystem::remove(temp);
        throw DataError(fmt::format("writing '{}' failed at byte offset {}", excerpt(temp.string(), 256), done));
      }
      done += chunk;
    }
    if (gzclose(file.release()) != Z_OK) {
      std::filesystem::remove(temp);
      throw DataError(fmt::format("writing '{}' failed when closing it", excerpt(temp.string(), 256)));
    }
  }
  std::filesystem::rename(temp, path);
}

}  // namespace fastlearn
