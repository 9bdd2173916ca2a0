#include <fastlearn/core/event_file.h>

#include <fastlearn/core/detail/text.h>
#include <fastlearn/core/error.h>

#include <fmt/format.h>

#include <unistd.h>

#include <array>
#include <atomic>
#include <bit>
#include <cerrno>
#include <chrono>
#include <cstring>

namespace fastlearn {

namespace {

constexpr std::array<std::uint32_t, 256> make_crc32c_table() {
  std::array<std::uint32_t, 256> table{};
  for (std::uint32_t i = 0; i < 256; ++i) {
    std::uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;  // reflected Castagnoli polynomial
    table[i] = c;
  }
  return table;
}
constexpr auto kCrc32cTable = make_crc32c_table();

// Protocol buffer wire format: varints, field keys, little-endian fixed-width numbers.
void put_varint(std::string& out, std::uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7F) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}
void put_key(std::string& out, int field, int wire_type) {
  put_varint(out, static_cast<std::uint64_t>(field << 3 | wire_type));
}
template <class T>
void put_fixed(std::string& out, T v) {
  static_assert(std::endian::native == std::endian::little, "event files are little-endian");
  char bytes[sizeof v];
  std::memcpy(bytes, &v, sizeof v);
  out.append(bytes, sizeof v);
}
void put_bytes(std::string& out, int field, std::string_view bytes) {
  put_key(out, field, 2);
  put_varint(out, bytes.size());
  out.append(bytes);
}

// Event { double wall_time = 1; int64 step = 2; oneof { string file_version = 3; Summary summary = 5; } }
std::string event_header(std::int64_t step) {
  const double wall_time = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  std::string e;
  put_key(e, 1, 1);
  put_fixed(e, wall_time);
  put_key(e, 2, 0);
  put_varint(e, static_cast<std::uint64_t>(step));
  return e;
}

std::string host_name() {
  char buf[256] = {};
  if (gethostname(buf, sizeof buf - 1) != 0) return "localhost";
  return buf;
}

}  // namespace

std::uint32_t crc32c(std::string_view data) {
  std::uint32_t c = 0xFFFFFFFFu;
  for (unsigned char b : data) c = kCrc32cTable[(c ^ b) & 0xFF] ^ (c >> 8);
  return c ^ 0xFFFFFFFFu;
}

std::uint32_t masked_crc32c(std::string_view data) {
  const std::uint32_t c = crc32c(data);
  return ((c >> 15) | (c << 17)) + 0xA282EAD8u;
}

EventFileWriter::EventFileWriter(const std::filesystem::path& dir) {
  static std::atomic<int> files_made{0};  // two writers in one second of one process get distinct names
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec)
    throw Error(
        fmt::format("TensorBoard: cannot create the log directory '{}': {}", excerpt(dir.string(), 256), ec.message()));
  const auto seconds =
      std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
  path_ = dir / fmt::format("events.out.tfevents.{}.{}.{}.{}", seconds, host_name(), getpid(), files_made++);
  out_.open(path_, std::ios::binary | std::ios::trunc);
  if (!out_) {
    throw Error(fmt::format("TensorBoard: cannot open '{}' for writing: {}", excerpt(path_.string(), 256),
                            std::strerror(errno)));
  }
  auto e = event_header(0);
  put_bytes(e, 3, "brain.Event:2");
  write_record(e);
  flush();
}

void EventFileWriter::add_scalar(std::string_view tag, double value, std::int64_t step) {
  // Summary { repeated Value value = 1; }  Value { string tag = 1; float simple_value = 2; }
  std::string v;
  put_bytes(v, 1, tag);
  put_key(v, 2, 5);
  put_fixed(v, static_cast<float>(value));
  std::string summary;
  put_bytes(summary, 1, v);
  auto e = event_header(step);
  put_bytes(e, 5, summary);
  write_record(e);
}

void EventFileWriter::write_record(std::string_view event) {
  std::string header;
  put_fixed(header, static_cast<std::uint64_t>(event.size()));
  std::string record = header;
  put_fixed(record, masked_crc32c(header));
  record.append(event);
  put_fixed(record, masked_crc32c(event));
  out_.write(record.data(), static_cast<std::streamsize>(record.size()));
  if (!out_)
    throw Error(
        fmt::format("TensorBoard: writing '{}' failed: {}", excerpt(path_.string(), 256), std::strerror(errno)));
}

void EventFileWriter::flush() {
  out_.flush();
  if (!out_)
    throw Error(
        fmt::format("TensorBoard: writing '{}' failed: {}", excerpt(path_.string(), 256), std::strerror(errno)));
}

}  // namespace fastlearn
