#include <fastlearn/data/npy.h>

#include <fastlearn/core/atomic_file.h>
#include <fastlearn/core/detail/text.h>
#include <fastlearn/core/error.h>

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <limits>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

namespace fastlearn {

namespace {

constexpr std::string_view kMagic = "\x93NUMPY";
constexpr std::size_t kMaxHeader = 1 << 20;  // numpy writes ~128 bytes; version 2.0 could claim 4 GB

[[noreturn]] void fail(std::string_view origin, const std::string& what) {
  throw DataError(fmt::format("{}: not a .npy file fastlearn reads: {}", excerpt(origin, 256), what));
}

struct ElementType {
  at::ScalarType stored;  // what the file's bytes are read as
  at::ScalarType result;  // the tensor's type (an unsigned integer widens to a signed one)
  std::size_t size;
};

ElementType element_type(const std::string& descr, std::string_view origin, bool& swap) {
  const char order = descr.empty() ? ' ' : descr[0];
  const std::string code = descr.empty() ? descr : descr.substr(1);
  static const std::vector<std::pair<std::string, ElementType>> types{
      {"f2", {at::kHalf, at::kHalf, 2}}, {"f4", {at::kFloat, at::kFloat, 4}}, {"f8", {at::kDouble, at::kDouble, 8}},
      {"i1", {at::kChar, at::kChar, 1}}, {"i2", {at::kShort, at::kShort, 2}}, {"i4", {at::kInt, at::kInt, 4}},
      {"i8", {at::kLong, at::kLong, 8}}, {"u1", {at::kByte, at::kByte, 1}},   {"u2", {at::kShort, at::kInt, 2}},
      {"u4", {at::kInt, at::kLong, 4}},  {"b1", {at::kBool, at::kBool, 1}}};
  const auto found = std::find_if(types.begin(), types.end(), [&](const auto& t) { return t.first == code; });
  if (found == types.end() || (order != '<' && order != '>' && order != '|' && order != '='))
    fail(origin, fmt::format("'descr' is '{}'; fastlearn reads float16/32/64, int8/16/32/64, uint8/16/32 and bool "
                             "arrays (no objects, strings, structured or uint64 types)",
                             excerpt(descr)));
  swap = order == '>' && found->second.size > 1;
  return found->second;
}

std::vector<std::int64_t> shape_of(const std::string& text, std::string_view origin) {
  std::vector<std::int64_t> shape;
  std::stringstream items(text);
  std::string item;
  while (std::getline(items, item, ',')) {
    const auto begin = item.find_first_not_of(" \t");
    if (begin == std::string::npos) continue;  // the empty item after "(5," or of "()"
    const auto end = item.find_last_not_of(" \t");
    const auto digits = item.substr(begin, end - begin + 1);
    if (digits.empty() || digits.size() > 18 ||
        !std::all_of(digits.begin(), digits.end(), [](unsigned char c) { return c >= '0' && c <= '9'; }))
      fail(origin, fmt::format("'shape' ({}) holds '{}', not a dimension", excerpt(text), excerpt(digits)));
    shape.push_back(std::stoll(digits));
  }
  if (shape.size() > 32) fail(origin, fmt::format("'shape' has {} dimensions; at most 32", shape.size()));
  return shape;
}

}  // namespace

at::Tensor parse_npy(std::string_view bytes, std::string_view origin) {
  if (bytes.size() < 10 || bytes.substr(0, kMagic.size()) != kMagic) fail(origin, "it does not start with \\x93NUMPY");
  const auto major = static_cast<unsigned char>(bytes[6]);
  if (major < 1 || major > 3) fail(origin, fmt::format("format version {} (fastlearn reads 1.0 to 3.0)", major));
  const auto u8 = [&](std::size_t i) { return static_cast<std::uint64_t>(static_cast<unsigned char>(bytes[i])); };
  std::size_t header_at = 10;
  std::uint64_t header_len = u8(8) | (u8(9) << 8);
  if (major >= 2) {
    if (bytes.size() < 12) fail(origin, "the file ends inside the header's length");
    header_len = u8(8) | (u8(9) << 8) | (u8(10) << 16) | (u8(11) << 24);
    header_at = 12;
  }
  if (header_len > kMaxHeader || header_at + header_len > bytes.size())
    fail(origin, fmt::format("a header of {} bytes, in a file of {}", header_len, bytes.size()));
  const std::string header(bytes.substr(header_at, header_len));
  std::smatch m;
  std::string descr, shape_text;
  bool fortran = false;
  if (!std::regex_search(header, m, std::regex(R"('descr'\s*:\s*'([^']*)')")))
    fail(origin, "its header has no 'descr' of a simple type");
  descr = m[1];
  if (!std::regex_search(header, m, std::regex(R"('fortran_order'\s*:\s*(True|False))")))
    fail(origin, "its header has no 'fortran_order'");
  fortran = m[1] == "True";
  if (!std::regex_search(header, m, std::regex(R"('shape'\s*:\s*\(([^)]*)\))")))
    fail(origin, "its header has no 'shape'");
  shape_text = m[1];
  const std::regex key(R"('(\w+)'\s*:)");
  const auto keys = std::distance(std::sregex_iterator(header.begin(), header.end(), key), std::sregex_iterator());
  if (keys != 3 || header.find('{') == std::string::npos)
    fail(origin, fmt::format("its header is not a dict of 'descr', 'fortran_order' and 'shape': {}", excerpt(header)));
  bool swap = false;
  const auto type = element_type(descr, origin, swap);
  const auto shape = shape_of(shape_text, origin);
  std::uint64_t count = 1;
  for (const auto d : shape) {
    if (d != 0 && count > std::numeric_limits<std::uint64_t>::max() / static_cast<std::uint64_t>(d) / type.size)
      fail(origin, fmt::format("'shape' ({}) holds more elements than any file", excerpt(shape_text)));
    count *= static_cast<std::uint64_t>(d);
  }
  const std::size_t data_at = header_at + header_len;
  const std::uint64_t data_bytes = count * type.size;
  if (data_bytes != bytes.size() - data_at)
    fail(origin, fmt::format("'shape' ({}) of '{}' is {} bytes of data, and the file has {} after its header{}",
                             excerpt(shape_text), excerpt(descr), data_bytes, bytes.size() - data_at,
                             data_bytes > bytes.size() - data_at ? " (truncated?)" : ""));
  // Fortran order: the bytes are the transpose's, row-major.
  std::vector<std::int64_t> stored_shape = shape;
  if (fortran) std::reverse(stored_shape.begin(), stored_shape.end());
  auto out = at::empty(stored_shape, at::TensorOptions().dtype(type.stored));
  if (data_bytes > 0) std::memcpy(out.data_ptr(), bytes.data() + data_at, data_bytes);
  if (swap) {
    auto* p = static_cast<unsigned char*>(out.data_ptr());
    for (std::uint64_t i = 0; i < count; ++i) std::reverse(p + i * type.size, p + (i + 1) * type.size);
  }
  if (type.result != type.stored) {  // uint16 / uint32: read their bits as unsigned, into the wider signed type
    auto wide = type.stored == at::kShort ? out.to(at::kInt).bitwise_and(0xFFFF)
                                          : out.to(at::kLong).bitwise_and(static_cast<std::int64_t>(0xFFFFFFFF));
    out = wide;
  }
  if (fortran) {
    std::vector<std::int64_t> reversed(shape.size());
    for (std::size_t i = 0; i < shape.size(); ++i) reversed[i] = static_cast<std::int64_t>(shape.size() - 1 - i);
    out = out.permute(reversed).contiguous();
  }
  return out;
}

at::Tensor read_npy(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw DataError(fmt::format("{}: cannot read the file (does it exist?)", excerpt(path.string(), 256)));
  std::ostringstream bytes;
  bytes << in.rdbuf();
  return parse_npy(bytes.str(), path.string());
}

std::string serialize_npy(const at::Tensor& tensor) {
  std::string descr;
  switch (tensor.scalar_type()) {
    case at::kFloat:
      descr = "<f4";
      break;
    case at::kDouble:
      descr = "<f8";
      break;
    case at::kChar:
      descr = "|i1";
      break;
    case at::kByte:
      descr = "|u1";
      break;
    case at::kShort:
      descr = "<i2";
      break;
    case at::kInt:
      descr = "<i4";
      break;
    case at::kLong:
      descr = "<i8";
      break;
    case at::kBool:
      descr = "|b1";
      break;
    default:
      throw Error(fmt::format("serialize_npy: a {} tensor; write float32, float64, an integer type or bool",
                              c10::toString(tensor.scalar_type())));
  }
  std::string shape;
  for (const auto d : tensor.sizes()) shape += fmt::format("{}, ", d);
  if (tensor.dim() > 1) shape.resize(shape.size() - 2);
  if (tensor.dim() == 1) shape.pop_back();  // "(5,)"
  std::string header = fmt::format("{{'descr': '{}', 'fortran_order': False, 'shape': ({}), }}", descr, shape);
  const std::size_t total = kMagic.size() + 4 + header.size() + 1;
  header.append((64 - total % 64) % 64, ' ');
  header += '\n';
  const auto data = tensor.detach().to(at::kCPU).contiguous();
  std::string out(kMagic);
  out += '\x01';
  out += '\x00';
  out += static_cast<char>(header.size() & 0xFF);
  out += static_cast<char>(header.size() >> 8);
  out += header;
  out.append(static_cast<const char*>(data.data_ptr()), data.nbytes());
  return out;
}

void write_npy(const std::filesystem::path& path, const at::Tensor& tensor) {
  write_file_atomically(path, serialize_npy(tensor));
}

}  // namespace fastlearn
