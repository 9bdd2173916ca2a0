#include <fastlearn/core/safetensors.h>

#include <fastlearn/core/detail/safetensors_header.h>

#include <fastlearn/core/atomic_file.h>
#include <fastlearn/core/detail/text.h>
#include <fastlearn/core/error.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <sys/stat.h>
#include <torch/torch.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cerrno>
#include <charconv>
#include <cstdint>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <ostream>
#include <set>
#include <sstream>

namespace fastlearn {
namespace {

using namespace safetensors_detail;  // NOLINT: the format's internals, in this file only
using Json = nlohmann::json;         // sorted keys: the reader restores the order from the data offsets

[[noreturn]] void fail_too_short(std::uint64_t file_size, std::string_view origin) {
  fail(origin, fmt::format("truncated: {} byte(s), fewer than the 8-byte header length at byte 0", file_size));
}

// ---- writing ----

// Throws unless `text` is valid UTF-8, which JSON strings must be.
void check_utf8(const std::string& text, std::string_view origin, std::string_view what) {
  try {
    (void)Json(text).dump();
  } catch (const Json::type_error&) {
    fail(origin, fmt::format("{} is not valid UTF-8", what));
  }
}

// What the header says of a tensor.
struct Spec {
  std::string_view name;
  at::ScalarType dtype;
  std::vector<std::int64_t> shape;
};

// The 8-byte length and the JSON header for tensors of `specs`, laid out in the given order. The JSON is padded with
// spaces to a multiple of 8 bytes, as the reference writer does, so the data buffer starts 8-byte aligned.
std::string make_header(const std::vector<Spec>& specs, const Metadata& metadata, std::string_view origin) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) {
    auto& meta = header[std::string(kMetadataKey)];
    meta = nlohmann::ordered_json::object();
    for (const auto& [key, value] : metadata) {
      check_utf8(key, origin, fmt::format("metadata key '{}'", excerpt(key)));
      check_utf8(value, origin, fmt::format("the value of metadata key '{}'", excerpt(key)));
      meta[key] = value;
    }
  }
  std::set<std::string_view> names;
  std::uint64_t offset = 0;
  for (const auto& [name, type, shape] : specs) {
    if (name == kMetadataKey)
      fail(origin, "the name '__metadata__' is reserved for the metadata; no tensor may have it");
    if (!names.insert(name).second) fail(origin, fmt::format("duplicate tensor name '{}'", excerpt(name)));
    check_utf8(std::string(name), origin, fmt::format("tensor name '{}'", excerpt(name)));
    const DType* dtype = dtype_by_type(type);
    if (!dtype) {
      fail(origin,
           fmt::format("tensor '{}' has dtype {}, which fastlearn does not store in safetensors (supported: {})",
                       excerpt(name), c10::toString(type), dtype_names()));
    }
    std::uint64_t numel = 1;
    for (const auto d : shape) numel *= static_cast<std::uint64_t>(d);
    const std::uint64_t bytes = numel * dtype->size;
    header[std::string(name)] = {{"dtype", std::string(dtype->name)},
                                 {"shape", shape},
                                 {"data_offsets", nlohmann::ordered_json::array({offset, offset + bytes})}};
    offset += bytes;
  }
  std::string json = header.dump();
  json.append((kLengthBytes - json.size() % kLengthBytes) % kLengthBytes, ' ');
  std::string out(kLengthBytes, '\0');
  for (std::uint64_t i = 0, n = json.size(); i < kLengthBytes; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xFF);
  return out + json;
}

// The header of saved tensors, each checked to be one the format stores.
std::string make_header(const NamedTensors& tensors, const Metadata& metadata, std::string_view origin) {
  std::vector<Spec> specs;
  for (const auto& [name, tensor] : tensors) {
    if (!tensor.defined()) fail(origin, fmt::format("tensor '{}' is undefined", excerpt(name)));
    if (tensor.layout() != at::kStrided) {
      std::ostringstream layout;
      layout << tensor.layout();
      fail(origin, fmt::format("tensor '{}' has layout {}; only dense (strided) tensors can be saved", excerpt(name),
                               layout.str()));
    }
    specs.push_back({name, tensor.scalar_type(), tensor.sizes().vec()});
  }
  return make_header(specs, metadata, origin);
}

// The tensor's values in contiguous host memory (the tensor itself when it already is).
at::Tensor host_contiguous(const std::string& name, const at::Tensor& tensor, std::string_view origin) {
  try {
    // resolve_neg/resolve_conj: a lazily negated view's memory holds the un-negated values.
    return tensor.detach().resolve_conj().resolve_neg().contiguous().to(at::kCPU).contiguous();
  } catch (const c10::Error& e) {
    fail(origin, fmt::format("copying tensor '{}' to the CPU failed: {}", excerpt(name), e.what_without_backtrace()));
  }
}

// The tensor's bytes as the file stores them (little-endian).
at::Tensor cpu_data(const std::string& name, const at::Tensor& tensor, std::string_view origin) {
  auto data = host_contiguous(name, tensor, origin);  // its copy's errors are already a CheckpointError
  if constexpr (std::endian::native == std::endian::big) {
    data = data.clone();
    swap_to_little_endian(data.data_ptr(), data.numel(), data.element_size());
  }
  return data;
}

template <typename Sink>
void write_data(const NamedTensors& tensors, std::string_view origin, Sink&& sink) {
  for (const auto& [name, tensor] : tensors) {
    const auto data = cpu_data(name, tensor, origin);
    if (data.nbytes() > 0) sink(static_cast<const char*>(data.const_data_ptr()), data.nbytes());
  }
}

std::uint32_t crc32_of(const void* data, std::uint64_t bytes) {
  return static_cast<std::uint32_t>(crc32_z(crc32_z(0, nullptr, 0), static_cast<const Bytef*>(data), bytes));
}

// The checksums kChecksumKey lists, one per entry of `header`, or nothing when the file has none.
std::optional<std::vector<std::uint32_t>> listed_checksums(const Header& header, std::string_view origin) {
  const auto it = header.metadata.find(std::string(kChecksumKey));
  if (it == header.metadata.end()) return std::nullopt;
  std::vector<std::uint32_t> sums;
  std::istringstream words(it->second);
  for (std::string word; words >> word;) {
    std::uint32_t value = 0;
    const auto [end, error] = std::from_chars(word.data(), word.data() + word.size(), value, 16);
    if (error != std::errc() || end != word.data() + word.size() || word.size() != 8)
      fail(origin, fmt::format("metadata {}: '{}' is not a checksum of 8 hex digits", kChecksumKey, excerpt(word)));
    sums.push_back(value);
  }
  if (sums.size() != header.entries.size())
    fail(origin, fmt::format("metadata {} lists {} checksum(s) for {} tensor(s)", kChecksumKey, sums.size(),
                             header.entries.size()));
  return sums;
}

// Creates the tensors of `header`, filling each with read(destination, file offset, byte count, name), and
// checks each against its listed checksum.
template <typename Read>
SafetensorsContent materialize(const Header& header, std::string_view origin, Read&& read) {
  SafetensorsContent content;
  content.metadata = header.metadata;
  content.tensors.reserve(header.entries.size());
  const auto checksums = listed_checksums(header, origin);
  for (std::size_t k = 0; k < header.entries.size(); ++k) {
    const auto& entry = header.entries[k];
    at::Tensor tensor;
    try {
      tensor = torch::empty(entry.shape, torch::TensorOptions().dtype(entry.dtype->type));
    } catch (const c10::Error& e) {
      fail(origin, fmt::format("cannot allocate tensor '{}' of shape [{}]: {}", excerpt(entry.name),
                               fmt::join(entry.shape, ", "), e.what_without_backtrace()));
    }
    const std::uint64_t bytes = entry.end - entry.begin;
    if (bytes > 0) read(tensor.data_ptr(), header.data_start + entry.begin, bytes, entry.name);
    if (checksums && crc32_of(tensor.const_data_ptr(), bytes) != (*checksums)[k]) {
      fail(origin, fmt::format("tensor '{}' (bytes {} to {} of the file) does not match its checksum: the file is "
                               "corrupt",
                               excerpt(entry.name), header.data_start + entry.begin, header.data_start + entry.end));
    }
    if (entry.dtype->type == at::kBool) {
      // Any byte but 0 or 1 in a bool is undefined behaviour in torch's kernels.
      const auto* data = static_cast<const std::uint8_t*>(tensor.const_data_ptr());
      const auto* bad = std::find_if(data, data + bytes, [](std::uint8_t b) { return b > 1; });
      if (bad != data + bytes) {
        fail(origin,
             fmt::format("BOOL tensor '{}' holds the byte {} at byte offset {} in the file; booleans are 0 or 1",
                         excerpt(entry.name), *bad, header.data_start + entry.begin + (bad - data)));
      }
    }
    swap_to_little_endian(tensor.data_ptr(), tensor.numel(), entry.dtype->size);
    content.tensors.emplace_back(entry.name, std::move(tensor));
  }
  return content;
}

// A file read with pread(); errors are CheckpointErrors naming it.
class InputFile {
 public:
  explicit InputFile(const std::filesystem::path& path) : origin_(path.string()) {
    fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd_ < 0) {
      const int error = errno;
      fail(origin_, fmt::format("cannot open: {}", std::strerror(error)));
    }
    struct stat info {};
    const int error = ::fstat(fd_, &info) == 0 ? 0 : errno;
    if (error != 0 || !S_ISREG(info.st_mode)) {
      ::close(fd_);
      fail(origin_, error != 0 ? fmt::format("cannot stat: {}", std::strerror(error)) : "is not a regular file");
    }
    size_ = static_cast<std::uint64_t>(info.st_size);
  }
  InputFile(const InputFile&) = delete;
  InputFile& operator=(const InputFile&) = delete;
  ~InputFile() { ::close(fd_); }

  std::uint64_t size() const { return size_; }
  const std::string& origin() const { return origin_; }

  // Reads exactly `n` bytes at `offset` into `out`, describing them as `what` in errors.
  void read(void* out, std::uint64_t offset, std::uint64_t n, std::string_view what) const {
    auto* dst = static_cast<char*>(out);
    for (std::uint64_t done = 0; done < n;) {
      const auto chunk = std::min<std::uint64_t>(n - done, std::uint64_t{1} << 30);
      const ssize_t got = ::pread(fd_, dst + done, chunk, static_cast<off_t>(offset + done));
      if (got < 0 && errno == EINTR) continue;
      if (got < 0) {
        const int error = errno;
        fail(origin_,
             fmt::format("reading {} at byte offset {} failed: {}", what, offset + done, std::strerror(error)));
      }
      if (got == 0) {
        fail(origin_, fmt::format("truncated: the file ended at byte offset {} while reading {} ({} more byte(s) "
                                  "expected); it shrank while being read",
                                  offset + done, what, n - done));
      }
      done += static_cast<std::uint64_t>(got);
    }
  }

 private:
  std::string origin_;
  int fd_ = -1;
  std::uint64_t size_ = 0;
};

}  // namespace

const at::Tensor* SafetensorsContent::find(std::string_view name) const {
  for (const auto& [key, tensor] : tensors)
    if (key == name) return &tensor;
  return nullptr;
}

std::string serialize_safetensors(const NamedTensors& tensors, const Metadata& metadata) {
  constexpr std::string_view origin = "serialize_safetensors";
  std::string out = make_header(tensors, metadata, origin);
  std::uint64_t total = out.size();
  for (const auto& [name, tensor] : tensors) total += tensor.nbytes();
  out.reserve(total);
  write_data(tensors, origin, [&](const char* data, std::size_t size) { out.append(data, size); });
  return out;
}

SafetensorsContent parse_safetensors(std::string_view bytes, std::string_view origin) {
  if (bytes.size() < kLengthBytes) fail_too_short(bytes.size(), origin);
  const auto n = header_length(reinterpret_cast<const unsigned char*>(bytes.data()), bytes.size(), origin);
  const Header header = parse_header(bytes.substr(kLengthBytes, n), bytes.size(), origin);
  return materialize(header, origin, [&](void* out, std::uint64_t offset, std::uint64_t size, const std::string&) {
    std::memcpy(out, bytes.data() + offset, size);
  });
}

Metadata with_checksums(const NamedTensors& tensors, Metadata metadata) {
  std::string sums;
  for (const auto& [name, tensor] : tensors) {
    const auto data = cpu_data(name, tensor, "with_checksums");
    if (!sums.empty()) sums += ' ';
    sums += fmt::format("{:08x}", crc32_of(data.const_data_ptr(), data.nbytes()));
  }
  metadata[std::string(kChecksumKey)] = std::move(sums);
  return metadata;
}

void save_checked_safetensors(const std::filesystem::path& path, const NamedTensors& tensors, Metadata metadata) {
  // Each tensor reaches host memory once, for its checksum and its bytes alike.
  NamedTensors host;
  host.reserve(tensors.size());
  for (const auto& [name, tensor] : tensors) host.emplace_back(name, host_contiguous(name, tensor, path.string()));
  save_safetensors(path, host, with_checksums(host, std::move(metadata)));
}

void save_checked_safetensors(const std::filesystem::path& path, const std::vector<DeferredTensor>& deferred,
                              Metadata metadata, bool write) {
  const std::string origin = path.string();
  if (!write) {
    for (const auto& d : deferred) (void)d.make();
    return;
  }
  std::vector<Spec> specs;
  for (const auto& d : deferred) specs.push_back({d.name, d.dtype, d.shape});
  // A placeholder as long as the checksums will be, found again in the header once they are known.
  const auto count = specs.size();
  metadata[std::string(kChecksumKey)] = count == 0 ? std::string() : std::string(count * 9 - 1, '0');
  const std::string header = make_header(specs, metadata, origin);
  const auto key = fmt::format("\"{}\":\"", kChecksumKey);
  const auto placeholder = header.find(key) + key.size();
  std::string sums;
  const auto add = [&](const at::Tensor& data, std::ostream& out) {
    if (!sums.empty()) sums += ' ';
    sums += fmt::format("{:08x}", crc32_of(data.const_data_ptr(), data.nbytes()));
    if (data.nbytes() > 0) out.write(static_cast<const char*>(data.const_data_ptr()), data.nbytes());
  };
  try {
    write_file_atomically(path, [&](std::ostream& out) {
      out.write(header.data(), static_cast<std::streamsize>(header.size()));
      for (const auto& d : deferred) {
        const auto made = d.make();
        if (!made.defined() || made.scalar_type() != d.dtype || made.sizes().vec() != d.shape)
          fail(origin,
               fmt::format("tensor '{}' was promised as {} {} and made as {}", excerpt(d.name), c10::toString(d.dtype),
                           fmt::join(d.shape, "x"), made.defined() ? c10::toString(made.scalar_type()) : "nothing"));
        add(cpu_data(d.name, made, origin), out);
      }
      out.seekp(static_cast<std::streamoff>(placeholder));
      out.write(sums.data(), static_cast<std::streamsize>(sums.size()));
      out.seekp(0, std::ios_base::end);
    });
  } catch (const CheckpointError&) {
    throw;
  } catch (const Error& e) {
    throw CheckpointError(e.what());
  }
}

void save_safetensors(const std::filesystem::path& path, const NamedTensors& tensors, const Metadata& metadata) {
  const std::string origin = path.string();
  const std::string header = make_header(tensors, metadata, origin);
  try {
    write_file_atomically(path, [&](std::ostream& out) {
      out.write(header.data(), static_cast<std::streamsize>(header.size()));
      write_data(tensors, origin,
                 [&](const char* data, std::size_t size) { out.write(data, static_cast<std::streamsize>(size)); });
    });
  } catch (const CheckpointError&) {
    throw;
  } catch (const Error& e) {
    throw CheckpointError(e.what());
  }
}

namespace {

Header read_header(const InputFile& file) {
  const std::string& origin = file.origin();
  if (file.size() < kLengthBytes) fail_too_short(file.size(), origin);
  std::array<unsigned char, kLengthBytes> prefix{};
  file.read(prefix.data(), 0, kLengthBytes, "the header length");
  const auto n = header_length(prefix.data(), file.size(), origin);
  std::string text(n, '\0');
  file.read(text.data(), kLengthBytes, n, "the JSON header");
  return parse_header(text, file.size(), origin);
}

}  // namespace

Metadata load_safetensors_metadata(const std::filesystem::path& path) {
  const InputFile file(path);
  return read_header(file).metadata;
}

SafetensorsContent load_safetensors(const std::filesystem::path& path) {
  const InputFile file(path);
  const std::string& origin = file.origin();
  const Header header = read_header(file);
  return materialize(header, origin, [&](void* out, std::uint64_t offset, std::uint64_t size, const std::string& name) {
    file.read(out, offset, size, fmt::format("the data of tensor '{}'", excerpt(name)));
  });
}

}  // namespace fastlearn
