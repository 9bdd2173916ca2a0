#pragma once
// TensorBoard event files: the TFRecord framing (length, masked CRC32C of the length, payload, masked
// CRC32C of the payload) around Event protocol buffers, encoded here by hand (the few fields a scalar
// needs), so that TensorBoard's own reader loads them without TensorFlow or libprotobuf.
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>

namespace fastlearn {

/// CRC-32C (Castagnoli), the checksum of TFRecord files.
std::uint32_t crc32c(std::string_view data);
/// TFRecord's masked CRC: the CRC rotated right by 15 bits plus a constant.
std::uint32_t masked_crc32c(std::string_view data);

/// Appends scalar summaries to one new event file; the first record is the file version event.
class EventFileWriter {
 public:
  /// Creates `dir` and a file named events.out.tfevents.<seconds>.<host>.<pid>.<n> in it.
  explicit EventFileWriter(const std::filesystem::path& dir);
  EventFileWriter(const EventFileWriter&) = delete;
  EventFileWriter& operator=(const EventFileWriter&) = delete;

  /// Records `value` (stored as float32, as TensorBoard's simple_value) under `tag` at `step`.
  void add_scalar(std::string_view tag, double value, std::int64_t step);
  /// Hands everything written so far to the operating system (TensorBoard can then read it).
  void flush();
  const std::filesystem::path& path() const { return path_; }

 private:
  void write_record(std::string_view event);

  std::filesystem::path path_;
  std::ofstream out_;
};

}  // namespace fastlearn
