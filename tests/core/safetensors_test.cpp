// safetensors reading and writing: round trips of every dtype and layout, the exact bytes, errors that
// name the tensor and byte offset for each kind of corrupt file, atomic replacement of the old file, and
// interop both ways with the reference Python implementation when an interpreter was configured.
#include <fastlearn/core/atomic_file.h>
#include <fastlearn/core/error.h>
#include <fastlearn/core/safetensors.h>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <torch/torch.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <random>
#include <stdexcept>

#include "support/build_paths.h"
#include "support/processes.h"

namespace fl = fastlearn;
namespace fs = std::filesystem;

namespace {

// The tensors of tests/python/safetensors_interop.py's reference(), built with the same torch ops.
fl::NamedTensors reference() {
  const auto base = torch::arange(24, torch::kFloat64);
  const auto f32 = (base.to(torch::kFloat32) / 3 - 2).reshape({4, 6});
  return {{"f64", (base / 7 - 1.5).reshape({2, 3, 4})},
          {"f32", f32},
          {"f32_t", f32.t()},  // not contiguous
          {"f16", (base / 5 - 2).to(torch::kHalf)},
          {"bf16", (base / 9 + 0.25).to(torch::kBFloat16).reshape({6, 4})},
          {"i64", (base.to(torch::kInt64) * 1000000007 - 3).reshape({3, 8})},
          {"i32", (base.to(torch::kInt32) * 65537 - 9).reshape({8, 3})},
          {"i16", (base.to(torch::kInt16) * 1111 - 7000).reshape({2, 12})},
          {"i8", (base.to(torch::kInt8) * 5 - 60).reshape({4, 3, 2})},
          {"u8", (base.to(torch::kUInt8) * 10).reshape({12, 2})},
          {"bool", (base.to(torch::kInt64).remainder(3) == 0).reshape({2, 12})},
          {"scalar", torch::tensor(3.5, torch::kFloat32)},
          {"empty", torch::zeros({0, 3}, torch::kFloat32)}};
}

const fl::Metadata kMetadata{{"format", "pt"}, {"epoch", "3"}, {"note", "f\u00fcr \u2713"}};

// Expects every tensor of `actual` to have the name, dtype, shape and values of `expected`, in order.
void expect_same(const fl::NamedTensors& actual, const fl::NamedTensors& expected) {
  ASSERT_EQ(actual.size(), expected.size());
  for (std::size_t i = 0; i < expected.size(); ++i) {
    const auto& [name, want] = expected[i];
    const auto& [got_name, got] = actual[i];
    EXPECT_EQ(got_name, name) << "at index " << i;
    EXPECT_EQ(got.scalar_type(), want.scalar_type()) << name;
    EXPECT_EQ(got.sizes(), want.sizes()) << name;
    EXPECT_TRUE(got.device().is_cpu()) << name;
    EXPECT_TRUE(got.is_contiguous()) << name;
    EXPECT_TRUE(torch::equal(got, want.cpu())) << name << ": " << got << " vs " << want;
  }
}

// The bytes of a safetensors file with header `json` (taken as is) and data buffer `data`.
std::string craft(std::string_view json, std::string_view data = {}) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((json.size() >> (8 * i)) & 0xFF);
  return out.append(json).append(data);
}

// Expects parse_safetensors(bytes) to throw a CheckpointError whose message contains every one of `parts`.
void expect_error(const std::string& bytes, std::initializer_list<std::string> parts) {
  try {
    const auto content = fl::parse_safetensors(bytes, "model.safetensors");
    ADD_FAILURE() << "parse_safetensors accepted " << content.tensors.size() << " tensor(s) from " << bytes.substr(8);
  } catch (const fl::CheckpointError& e) {
    const std::string message = e.what();
    EXPECT_TRUE(message.starts_with("model.safetensors: ")) << message;
    for (const auto& part : parts) {
      EXPECT_NE(message.find(part), std::string::npos) << "missing '" << part << "' in: " << message;
    }
  }
}

std::string read_bytes(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

void write_bytes(const fs::path& path, std::string_view bytes) {
  std::ofstream(path, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

class Safetensors : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("fastlearn-safetensors-" + std::to_string(getpid()) + "-" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // The names of the files in the test directory.
  std::vector<std::string> files() const {
    std::vector<std::string> names;
    for (const auto& entry : fs::directory_iterator(dir_)) names.push_back(entry.path().filename().string());
    std::sort(names.begin(), names.end());
    return names;
  }

  fs::path dir_;
};

// ---- round trips and the format ----

TEST_F(Safetensors, EveryDtypeAndLayoutRoundTripsThroughAFile) {
  auto tensors = reference();
  const auto wide = torch::arange(40, torch::kInt64).reshape({5, 8});
  tensors.emplace_back("strided", wide.slice(0, 0, 5, 2).slice(1, 1, 8, 3));     // steps in both dimensions
  tensors.emplace_back("expanded", torch::tensor({1.5, -2.5}).expand({3, 2}));   // stride 0
  tensors.emplace_back("negated", at::_neg_view(torch::tensor({1.0F, -2.0F})));  // lazily negated view
  tensors.emplace_back("requires_grad", torch::ones({2, 2}, torch::requires_grad()));
  tensors.emplace_back("empty_3d", torch::empty({2, 0, 4}, torch::kInt16));
  tensors.emplace_back("scalar_bool", torch::tensor(true));
  tensors.emplace_back("special", torch::tensor({0.0, -0.0, std::numeric_limits<double>::infinity(), 1e-310}));
  fl::save_safetensors(dir_ / "m.safetensors", tensors, kMetadata);

  const auto content = fl::load_safetensors(dir_ / "m.safetensors");
  expect_same(content.tensors, tensors);
  EXPECT_EQ(content.metadata, kMetadata);
  EXPECT_TRUE(torch::equal(*content.find("negated"), torch::tensor({-1.0F, 2.0F})));
  // -0.0 == 0.0 for torch::equal: compare the bits of the float column too.
  EXPECT_TRUE(torch::equal(content.find("special")->view(torch::kInt64), tensors.back().second.view(torch::kInt64)));
  EXPECT_EQ(files(), std::vector<std::string>{"m.safetensors"});
}

TEST_F(Safetensors, NoTensorsAndNoMetadataRoundTrip) {
  const auto bytes = fl::serialize_safetensors({});
  EXPECT_EQ(bytes.substr(8), "{}      ");
  const auto content = fl::parse_safetensors(bytes, "empty.safetensors");
  EXPECT_TRUE(content.tensors.empty());
  EXPECT_TRUE(content.metadata.empty());
}

TEST_F(Safetensors, TheBytesFollowTheFormat) {
  const auto bytes = fl::serialize_safetensors(
      {{"b", torch::tensor({1, 258}, torch::kInt32)}, {"a", torch::tensor({7}, torch::kUInt8)}}, {{"k", "v"}});
  const std::string json = R"({"__metadata__":{"k":"v"},"b":{"dtype":"I32","shape":[2],"data_offsets":[0,8]},)"
                           R"("a":{"dtype":"U8","shape":[1],"data_offsets":[8,9]}})";
  const std::string padded = json + std::string((8 - json.size() % 8) % 8, ' ');  // the data starts 8-byte aligned
  EXPECT_EQ(bytes, craft(padded, std::string("\x01\x00\x00\x00\x02\x01\x00\x00\x07", 9)));
}

TEST_F(Safetensors, SerializeAndSaveWriteTheSameBytes) {
  fl::save_safetensors(dir_ / "m.safetensors", reference(), kMetadata);
  EXPECT_EQ(read_bytes(dir_ / "m.safetensors"), fl::serialize_safetensors(reference(), kMetadata));
}

TEST_F(Safetensors, LoadedTensorsOwnTheirMemoryAndKeepTheBufferOrder) {
  // Keys out of buffer order (a JSON object is unordered), a padded header: tensors come back in buffer order.
  std::string bytes = craft(R"({"z":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},)"
                            R"("a":{"dtype":"U8","shape":[],"data_offsets":[2,3]}}   )",
                            "\x05\x06\x07");
  const auto content = fl::parse_safetensors(bytes, "m.safetensors");
  const auto* begin = bytes.data();
  const auto* end = bytes.data() + bytes.size();
  for (const auto& [name, tensor] : content.tensors) {
    const auto* data = static_cast<const char*>(tensor.const_data_ptr());
    EXPECT_TRUE(data + tensor.nbytes() <= begin || data >= end) << name << " is a view into the input";
  }
  std::fill(bytes.begin(), bytes.end(), '\0');
  bytes = std::string();
  ASSERT_EQ(content.tensors.size(), 2U);
  EXPECT_EQ(content.tensors[0].first, "z");
  EXPECT_EQ(content.tensors[1].first, "a");
  EXPECT_TRUE(torch::equal(content.tensors[0].second, torch::tensor({5, 6}, torch::kUInt8)));
  EXPECT_EQ(content.tensors[1].second.dim(), 0);
  EXPECT_EQ(content.tensors[1].second.item<std::uint8_t>(), 7);
  ASSERT_NE(content.find("a"), nullptr);
  EXPECT_EQ(content.find("a"), &content.tensors[1].second);
  EXPECT_EQ(content.find("missing"), nullptr);
}

// ---- what the writer refuses ----

TEST_F(Safetensors, DuplicateAndReservedNamesAreRejected) {
  try {
    fl::save_safetensors(dir_ / "m.safetensors", {{"w", torch::ones(2)}, {"b", torch::ones(1)}, {"w", torch::ones(3)}});
    ADD_FAILURE() << "duplicate name accepted";
  } catch (const fl::CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("duplicate tensor name 'w'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("m.safetensors"), std::string::npos) << e.what();
  }
  EXPECT_THROW(fl::serialize_safetensors({{"__metadata__", torch::ones(1)}}), fl::CheckpointError);
  EXPECT_TRUE(files().empty());
}

TEST_F(Safetensors, UnsupportedTensorsAreRejectedByName) {
  const auto check = [](const fl::NamedTensors& tensors, std::initializer_list<std::string> parts) {
    try {
      fl::serialize_safetensors(tensors, {{"k", "v"}});
      ADD_FAILURE() << "accepted " << tensors.front().first;
    } catch (const fl::CheckpointError& e) {
      for (const auto& part : parts) EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
    }
  };
  check({{"c", torch::ones(2, torch::kComplexFloat)}}, {"tensor 'c'", "ComplexFloat"});
  check({{"u", torch::ones(2, torch::kUInt16)}}, {"tensor 'u'", "UInt16"});
  check({{"s", torch::ones({2, 2}).to_sparse()}}, {"tensor 's'", "layout"});
  check({{"n", at::Tensor()}}, {"tensor 'n'", "undefined"});
  check({{"bad\xff", torch::ones(1)}}, {"not valid UTF-8"});
  EXPECT_THROW(fl::serialize_safetensors({}, {{"k", "\xc3"}}), fl::CheckpointError);
}

// ---- corrupt files: each error names the tensor and/or the byte offset ----

TEST_F(Safetensors, TooShortForTheLengthIsTruncated) {
  expect_error("", {"truncated", "0 byte(s)", "byte 0"});
  expect_error("abcdefg", {"truncated", "7 byte(s)", "byte 0"});
}

TEST_F(Safetensors, HeaderLengthBeyondTheFileIsRejected) {
  std::string bytes = craft("{}");
  bytes[0] = static_cast<char>(0x7F);  // 9999999 = 0x98967F
  bytes[1] = static_cast<char>(0x96);
  bytes[2] = static_cast<char>(0x98);
  expect_error(bytes, {"header length 9999999 at byte 0 exceeds the file size 10"});
  bytes.assign(8, '\xff');
  bytes += "{}";
  expect_error(bytes, {"header length 18446744073709551615 at byte 0 exceeds the file size 10"});
}

TEST_F(Safetensors, InvalidJsonNamesTheBytePosition) {
  const std::string json = R"({"a": {"dtype": "F32",, "shape": [1], "data_offsets": [0, 4]}})";
  const auto at = json.find(",,") + 1;
  expect_error(craft(json, "abcd"), {"invalid JSON header", fmt::format("byte {} of the file", 8 + at),
                                     fmt::format("byte {} of the header", at)});
  expect_error(craft(""), {"invalid JSON header", "byte 8 of the file"});
  expect_error(craft("{\"a\": \"\xff\"}"), {"invalid JSON header", "UTF-8"});
  expect_error(craft("{} x"), {"invalid JSON header", "byte 11 of the file"});  // only spaces may pad it
  expect_error(craft(R"({"a": 1e999})"), {"invalid JSON header"});
}

TEST_F(Safetensors, HeaderThatIsNotTheFormatsShapeIsRejected) {
  expect_error(craft("[1, 2]"), {"header at byte 8 is a JSON array, not an object"});
  expect_error(craft(R"({"x": 3})"), {"tensor 'x'", "JSON number, not an object"});
  expect_error(craft(R"({"x": {"shape": [1], "data_offsets": [0, 4]}})", "abcd"), {"tensor 'x'", "no \"dtype\""});
  expect_error(craft(R"({"x": {"dtype": "F32", "data_offsets": [0, 4]}})", "abcd"), {"tensor 'x'", "no \"shape\""});
  expect_error(craft(R"({"x": {"dtype": "F32", "shape": [1]}})", "abcd"), {"tensor 'x'", "no \"data_offsets\""});
  expect_error(craft(R"({"x": {"dtype": 5, "shape": [1], "data_offsets": [0, 4]}})", "abcd"),
               {"dtype of tensor 'x'", "not a string"});
  expect_error(craft(R"({"x": {"dtype": "F32", "shape": 1, "data_offsets": [0, 4]}})", "abcd"),
               {"shape of tensor 'x'", "not an array"});
  expect_error(craft(R"({"x": {"dtype": "F32", "shape": [1], "data_offsets": [0]}})", "abcd"),
               {"data_offsets of tensor 'x' are [0]"});
  expect_error(craft(R"({"x": {"dtype": "F32", "shape": [1], "data_offsets": [0, -4]}})", "abcd"),
               {"data_offsets of tensor 'x'"});
  expect_error(craft(R"({"__metadata__": {"epoch": 3}})"), {"__metadata__ key 'epoch'", "must be strings"});
  expect_error(craft(R"({"__metadata__": ["a"]})"), {"__metadata__ is a JSON array"});
}

TEST_F(Safetensors, UnknownDtypeNamesTheTensor) {
  expect_error(craft(R"({"x": {"dtype": "F8_E4M3", "shape": [2], "data_offsets": [0, 2]}})", "ab"),
               {"unknown dtype 'F8_E4M3' for tensor 'x'"});
}

TEST_F(Safetensors, ShapeThatDisagreesWithTheOffsetsNamesBoth) {
  expect_error(craft(R"({"w": {"dtype": "F32", "shape": [3, 4], "data_offsets": [0, 40]}})", std::string(40, 'x')),
               {"shape [3,4] of tensor 'w' (F32) needs 48 bytes but data_offsets [0, 40] span 40"});
}

TEST_F(Safetensors, BadDimensionsAreRejected) {
  expect_error(craft(R"({"w": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}})", "abcd"),
               {"shape [-1] of tensor 'w' has -1 at index 0"});
  expect_error(craft(R"({"w": {"dtype": "F32", "shape": [1.5], "data_offsets": [0, 4]}})", "abcd"),
               {"of tensor 'w' has 1.5 at index 0"});
  // Products that overflow 64 bits must not wrap around to a small size that matches the offsets.
  expect_error(craft(R"({"w": {"dtype": "U8", "shape": [4294967296, 4294967296, 0], "data_offsets": [0, 0]}})"),
               {"tensor 'w' describes more than 2^63 bytes"});
  expect_error(craft(R"({"w": {"dtype": "F64", "shape": [2305843009213693952], "data_offsets": [0, 0]}})"),
               {"tensor 'w' describes more than 2^63 bytes"});
  expect_error(craft(R"({"w": {"dtype": "U8", "shape": [9223372036854775808], "data_offsets": [0, 0]}})"),
               {"has 9223372036854775808 at index 0"});
}

TEST_F(Safetensors, OffsetsBeyondTheBufferNameTheTensorAndFileOffset) {
  const std::string json = R"({"0.weight": {"dtype": "F32", "shape": [96], "data_offsets": [128, 512]}})";
  expect_error(craft(json, std::string(400, 'x')),
               {"tensor '0.weight' data_offsets [128, 512] exceed the data buffer of 400 bytes",
                fmt::format("byte offset {} in the file", 8 + json.size() + 512)});
  expect_error(craft(R"({"w": {"dtype": "U8", "shape": [0], "data_offsets": [18446744073709551615, 0]}})"),
               {"data_offsets of tensor 'w'"});
  expect_error(craft(R"({"w": {"dtype": "U8", "shape": [0], "data_offsets": [5, 4]}})", "abcde"),
               {"tensor 'w' data_offsets [5, 4] end before they begin"});
}

TEST_F(Safetensors, GapsOverlapsAndUncoveredBytesNameBothTensors) {
  const auto two = [](int a0, int a1, int b0, int b1) {
    return fmt::format(R"({{"a": {{"dtype": "U8", "shape": [{}], "data_offsets": [{}, {}]}}, )"
                       R"("b": {{"dtype": "U8", "shape": [{}], "data_offsets": [{}, {}]}}}})",
                       a1 - a0, a0, a1, b1 - b0, b0, b1);
  };
  auto json = two(0, 4, 8, 12);
  expect_error(craft(json, std::string(12, 'x')),
               {"gap of 4 bytes", "tensor 'a' (data_offsets [0, 4])", "tensor 'b' (data_offsets [8, 12])",
                fmt::format("byte offset {} in the file", 8 + json.size() + 4)});
  json = two(4, 8, 8, 12);
  expect_error(craft(json, std::string(12, 'x')), {"gap of 4 bytes at the start of the data buffer, before tensor 'a'",
                                                   fmt::format("byte offset {} in the file", 8 + json.size())});
  json = two(0, 8, 4, 12);
  expect_error(craft(json, std::string(12, 'x')),
               {"tensor 'b' (data_offsets [4, 12]) overlaps tensor 'a' (data_offsets [0, 8])",
                fmt::format("byte offset {} in the file", 8 + json.size() + 4)});
  json = two(0, 4, 0, 4);
  expect_error(craft(json, std::string(4, 'x')), {"tensor 'b' (data_offsets [0, 4]) overlaps tensor 'a'"});
  json = two(0, 4, 4, 8);
  expect_error(craft(json, std::string(11, 'x')),
               {fmt::format("the last 3 byte(s) of the data buffer, from byte offset {} in the file, belong to no "
                            "tensor; the last tensor is 'b'",
                            8 + json.size() + 8)});
  expect_error(craft("{}", "x"),
               {"the last 1 byte(s) of the data buffer, from byte offset 10 in the file, belong to no tensor"});
}

TEST_F(Safetensors, DuplicateKeysAndDeepNestingAreRejected) {
  expect_error(craft(R"({"a": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]},)"
                     R"( "a": {"dtype": "U8", "shape": [1], "data_offsets": [1, 2]}})",
                     "xy"),
               {"the header has the key 'a' twice"});
  expect_error(craft(R"({"a": {"dtype": "U8", "dtype": "F32", "shape": [1], "data_offsets": [0, 1]}})", "x"),
               {"the header entry 'a' has the key 'dtype' twice"});
  expect_error(craft(std::string(10000, '[') + std::string(10000, ']')), {"nests JSON containers"});
  expect_error(craft(R"({"a": {"dtype": "U8", "shape": [[1]], "data_offsets": [0, 1]}})", "x"),
               {"nests JSON containers"});
}

TEST_F(Safetensors, BooleansOtherThanZeroOrOneAreRejected) {
  const std::string json = R"({"m": {"dtype": "BOOL", "shape": [3], "data_offsets": [0, 3]}})";
  expect_error(craft(json, std::string("\x01\x00\x02", 3)),
               {"BOOL tensor 'm' holds the byte 2", fmt::format("byte offset {} in the file", 8 + json.size() + 2)});
}

TEST_F(Safetensors, ChecksumsNameATensorWhoseBytesChanged) {
  const auto tensors = reference();
  const auto metadata = fl::with_checksums(tensors, kMetadata);
  ASSERT_TRUE(metadata.contains(std::string(fl::kChecksumKey)));
  EXPECT_EQ(metadata.at(std::string(fl::kChecksumKey)).size(), tensors.size() * 9 - 1) << "8 hex digits per tensor";
  const auto path = dir_ / "summed.safetensors";
  fl::save_safetensors(path, tensors, metadata);
  expect_same(fl::load_safetensors(path).tensors, tensors);
  const auto bytes = read_bytes(path);
  expect_same(fl::parse_safetensors(bytes, "model.safetensors").tensors, tensors);

  // One bit flipped in the last data byte of 'i32': a value that loads fine without the checksum.
  const auto header_end =
      8 + static_cast<std::size_t>(static_cast<unsigned char>(bytes[0]) | static_cast<unsigned char>(bytes[1]) << 8 |
                                   static_cast<unsigned char>(bytes[2]) << 16);
  std::uint64_t begin = header_end, end = header_end;
  for (const auto& [name, t] : tensors) {
    begin = end;
    end += static_cast<std::uint64_t>(t.nbytes());
    if (name == "i32") break;
  }
  auto flipped = bytes;
  flipped[end - 1] = static_cast<char>(flipped[end - 1] ^ 0x10);
  expect_error(flipped, {fmt::format("tensor 'i32' (bytes {} to {} of the file) does not match its checksum: the "
                                     "file is corrupt",
                                     begin, end)});
  write_bytes(path, flipped);
  EXPECT_THROW(fl::load_safetensors(path), fl::CheckpointError);
  // Without the checksums the same bytes load: this is what the checksums are for.
  const auto unsummed = fl::serialize_safetensors(tensors, kMetadata);
  auto flipped_unsummed = unsummed;
  flipped_unsummed[unsummed.size() - (bytes.size() - (end - 1))] ^= 0x10;
  EXPECT_NO_THROW((void)fl::parse_safetensors(flipped_unsummed, "model.safetensors"));

  // A checksum list that does not fit the tensors is an error too.
  auto short_list = metadata;
  short_list[std::string(fl::kChecksumKey)] = "0badf00d";
  expect_error(fl::serialize_safetensors(tensors, short_list),
               {"metadata fastlearn.crc32 lists 1 checksum(s) for 13 tensor(s)"});
  auto not_hex = metadata;
  not_hex[std::string(fl::kChecksumKey)].replace(0, 8, "xyz12345");
  expect_error(fl::serialize_safetensors(tensors, not_hex), {"'xyz12345' is not a checksum of 8 hex digits"});
}

TEST_F(Safetensors, ACheckedSaveWritesTheBytesOfAChecksumsAndSaveInTwoSteps) {
  auto tensors = reference();
  tensors.emplace_back("neg_view", torch::arange(6, torch::kFloat32).reshape({2, 3})._neg_view());  // lazily negated
  const auto two_steps = dir_ / "two_steps.safetensors", checked = dir_ / "checked.safetensors";
  fl::save_safetensors(two_steps, tensors, fl::with_checksums(tensors, kMetadata));
  fl::save_checked_safetensors(checked, tensors, kMetadata);
  EXPECT_EQ(read_bytes(checked), read_bytes(two_steps));
  const auto loaded = fl::load_safetensors(checked);
  EXPECT_TRUE(loaded.metadata.contains(std::string(fl::kChecksumKey)));
  expect_same(loaded.tensors, tensors);
  EXPECT_TRUE(torch::equal(loaded.tensors.back().second, -torch::arange(6, torch::kFloat32).reshape({2, 3})));
}

TEST_F(Safetensors, LoadErrorsNameTheFile) {
  const auto path = dir_ / "cut.safetensors";
  const auto bytes = fl::serialize_safetensors(reference(), kMetadata);
  write_bytes(path, bytes.substr(0, bytes.size() - 10));
  try {
    fl::load_safetensors(path);
    ADD_FAILURE() << "a truncated file loaded";
  } catch (const fl::CheckpointError& e) {
    const std::string message = e.what();
    EXPECT_TRUE(message.starts_with(path.string() + ": ")) << message;
    EXPECT_NE(message.find("exceed the data buffer"), std::string::npos) << message;
    EXPECT_NE(message.find("truncated"), std::string::npos) << message;
  }
  write_bytes(path, "abc");
  EXPECT_THROW(fl::load_safetensors(path), fl::CheckpointError);
  try {
    fl::load_safetensors(dir_ / "missing.safetensors");
    ADD_FAILURE() << "a missing file loaded";
  } catch (const fl::CheckpointError& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("missing.safetensors: cannot open: No such file or directory"), std::string::npos)
        << message;
  }
  EXPECT_THROW(fl::load_safetensors(dir_), fl::CheckpointError);
}

// What a fuzzer would try first: random truncations and byte changes are either parsed or refused with a
// CheckpointError; nothing else escapes, nothing crashes.
TEST_F(Safetensors, RandomCorruptionOnlyEverThrowsCheckpointError) {
  const auto valid = fl::serialize_safetensors(reference(), kMetadata);
  const auto header_end =
      8 + (static_cast<std::size_t>(static_cast<unsigned char>(valid[1])) << 8 | static_cast<unsigned char>(valid[0]));
  std::mt19937 random(1234);
  int refused = 0;
  for (int i = 0; i < 3000; ++i) {
    std::string bytes = valid;
    switch (i % 4) {
      case 0:
        bytes.resize(random() % bytes.size());
        break;
      case 1:
        bytes[random() % std::min(bytes.size(), header_end)] = static_cast<char>(random());
        break;
      case 2:
        bytes[8 + random() % (header_end - 8)] = "{}[],:\"0123456789-e. \\"[random() % 20];
        break;
      default:
        for (int k = 0; k < 4; ++k) bytes[random() % bytes.size()] = static_cast<char>(random());
    }
    try {
      fl::parse_safetensors(bytes, "fuzz");
    } catch (const fl::CheckpointError&) {
      ++refused;
    } catch (const std::exception& e) {
      ADD_FAILURE() << "case " << i << " threw something else: " << e.what();
    }
  }
  EXPECT_GT(refused, 1000);
}

// ---- atomic writes ----

TEST_F(Safetensors, AtomicWriteReplacesTheFileAndLeavesNoTemporary) {
  write_bytes(dir_ / "f", "old");
  fl::write_file_atomically(dir_ / "f", [](std::ostream& out) { out << "new contents"; });
  EXPECT_EQ(read_bytes(dir_ / "f"), "new contents");
  fl::write_file_atomically(dir_ / "g", std::string_view("bytes\0here", 10));
  EXPECT_EQ(read_bytes(dir_ / "g"), std::string("bytes\0here", 10));
  EXPECT_EQ(files(), (std::vector<std::string>{"f", "g"}));
}

TEST_F(Safetensors, AtomicWriteWhoseWriterThrowsLeavesTheOldFile) {
  const std::string old = "old checkpoint\n" + std::string(1000, 'x');
  write_bytes(dir_ / "model.safetensors", old);
  const auto throwing = [](std::ostream& out) {
    out << std::string(300000, 'y');  // more than the stream buffer: some of it reached the temporary
    throw std::runtime_error("writer failed");
  };
  EXPECT_THROW(
      {
        try {
          fl::write_file_atomically(dir_ / "model.safetensors", throwing);
        } catch (const std::runtime_error& e) {
          EXPECT_STREQ(e.what(), "writer failed");
          throw;
        }
      },
      std::runtime_error);
  EXPECT_EQ(read_bytes(dir_ / "model.safetensors"), old);
  EXPECT_EQ(files(), std::vector<std::string>{"model.safetensors"});
}

TEST_F(Safetensors, AtomicWriteWhoseWriterLeavesAFailedStreamIsRefused) {
  write_bytes(dir_ / "f", "old");
  const auto failing = [](std::ostream& out) {
    out << "partial";
    out.setstate(std::ios::failbit);  // as a failed formatted output would
    out << " rest";
  };
  try {
    fl::write_file_atomically(dir_ / "f", failing);
    ADD_FAILURE() << "a failed stream was committed";
  } catch (const fl::Error& e) {
    EXPECT_NE(std::string(e.what()).find((dir_ / "f").string()), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("failed state"), std::string::npos) << e.what();
  }
  EXPECT_EQ(read_bytes(dir_ / "f"), "old");
  EXPECT_EQ(files(), std::vector<std::string>{"f"});
}

TEST_F(Safetensors, AtomicWriteIntoAMissingDirectoryNamesThePathAndErrno) {
  const auto path = dir_ / "no" / "such" / "m.safetensors";
  try {
    fl::write_file_atomically(path, std::string_view("x"));
    ADD_FAILURE() << "wrote into a missing directory";
  } catch (const fl::Error& e) {
    EXPECT_NE(std::string(e.what()).find(path.string()), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("No such file or directory"), std::string::npos) << e.what();
  }
  EXPECT_THROW(fl::save_safetensors(path, reference()), fl::CheckpointError);
}

TEST_F(Safetensors, AtomicWriteThatFailsMidwayReportsErrnoAndLeavesTheOldFile) {
  // A file size limit makes write() fail with EFBIG once the temporary reaches 64 KiB.
  write_bytes(dir_ / "m.safetensors", "old");
  const auto previous_handler = std::signal(SIGXFSZ, SIG_IGN);
  rlimit previous{};
  ASSERT_EQ(getrlimit(RLIMIT_FSIZE, &previous), 0);
  rlimit limited = previous;
  limited.rlim_cur = 65536;
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &limited), 0);
  std::string message;
  try {
    fl::save_safetensors(dir_ / "m.safetensors", {{"big", torch::zeros({1 << 16})}});
  } catch (const fl::CheckpointError& e) {
    message = e.what();
  }
  setrlimit(RLIMIT_FSIZE, &previous);
  std::signal(SIGXFSZ, previous_handler);
  EXPECT_NE(message.find("m.safetensors"), std::string::npos) << message;
  EXPECT_NE(message.find(std::strerror(EFBIG)), std::string::npos) << message;
  EXPECT_EQ(read_bytes(dir_ / "m.safetensors"), "old");
  EXPECT_EQ(files(), std::vector<std::string>{"m.safetensors"});
}

TEST_F(Safetensors, SavingABadTensorKeepsTheOldCheckpoint) {
  fl::save_safetensors(dir_ / "m.safetensors", reference(), kMetadata);
  const auto before = read_bytes(dir_ / "m.safetensors");
  const fl::NamedTensors bad{{"ok", torch::ones(3)}, {"c", torch::ones(2, torch::kComplexDouble)}};
  EXPECT_THROW(fl::save_safetensors(dir_ / "m.safetensors", bad), fl::CheckpointError);
  EXPECT_EQ(read_bytes(dir_ / "m.safetensors"), before);
  EXPECT_EQ(files(), std::vector<std::string>{"m.safetensors"});
}

// ---- interop with the reference Python implementation ----

// Runs tests/python/safetensors_interop.py (or `args` as given when `script` is false); returns the exit
// status and the output.
std::pair<int, std::string> run_python(const std::string& args, bool script = true) {
  return fastlearn::testing::run_shell(fmt::format(
      "'{}' {} {}", FASTLEARN_PYTHON,
      script ? fmt::format("'{}/tests/python/safetensors_interop.py'", FASTLEARN_SOURCE_DIR) : std::string(), args));
}

// Why the Python interop tests cannot run, or an empty string.
std::string python_unavailable() {
  if (std::string_view(FASTLEARN_PYTHON).empty()) return "configured without -DFASTLEARN_PYTHON=<python>";
  if (!fs::exists(FASTLEARN_PYTHON)) return fmt::format("{} does not exist", FASTLEARN_PYTHON);
  const auto [status, output] = run_python("-c 'import safetensors.torch'", false);
  if (status != 0) return fmt::format("{} cannot import safetensors.torch: {}", FASTLEARN_PYTHON, output);
  return {};
}

TEST_F(Safetensors, PythonLoadsOurFilesExactly) {
  if (const auto why = python_unavailable(); !why.empty()) GTEST_SKIP() << why;
  const auto path = dir_ / "ours.safetensors";
  fl::save_safetensors(path, reference(), kMetadata);
  const auto [status, output] = run_python(fmt::format("check '{}'", path.string()));
  EXPECT_EQ(status, 0) << output;
  EXPECT_EQ(output, "OK\n");
}

TEST_F(Safetensors, WeLoadPythonsFilesExactly) {
  if (const auto why = python_unavailable(); !why.empty()) GTEST_SKIP() << why;
  const auto path = dir_ / "theirs.safetensors";
  const auto [status, output] = run_python(fmt::format("write '{}'", path.string()));
  ASSERT_EQ(status, 0) << output;
  const auto content = fl::load_safetensors(path);
  EXPECT_EQ(content.metadata, kMetadata);
  // Python orders the buffer by dtype alignment, then name; compare by name.
  const auto expected = reference();
  ASSERT_EQ(content.tensors.size(), expected.size());
  for (const auto& [name, want] : expected) {
    const auto* got = content.find(name);
    ASSERT_NE(got, nullptr) << name;
    EXPECT_EQ(got->scalar_type(), want.scalar_type()) << name;
    EXPECT_EQ(got->sizes(), want.sizes()) << name;
    EXPECT_TRUE(torch::equal(*got, want)) << name << ": " << *got << " vs " << want;
  }
}

}  // namespace

// The streamed save writes the bytes of a checked save of the same tensors (the checksums written into their
// placeholder afterwards), and holds at most one made tensor at a time: each is freed before the next is made.
TEST_F(Safetensors, AStreamedSaveWritesTheCheckedBytesMakingOneTensorAtATime) {
  const auto tensors = reference();
  std::vector<fl::DeferredTensor> deferred;
  c10::weak_intrusive_ptr<c10::TensorImpl> previous{c10::intrusive_ptr<c10::TensorImpl>()};
  int made = 0, alive_at_make = 0;
  for (const auto& [name, tensor] : tensors) {
    deferred.push_back(
        {.name = name, .dtype = tensor.scalar_type(), .shape = tensor.sizes().vec(), .make = [&, t = tensor] {
           alive_at_make += previous.expired() ? 0 : 1;
           auto copy = t.clone();  // a tensor nobody else holds, as a gathered one
           previous = c10::weak_intrusive_ptr<c10::TensorImpl>(copy.getIntrusivePtr());
           ++made;
           return copy;
         }});
  }
  const auto streamed = dir_ / "streamed.safetensors", checked = dir_ / "checked.safetensors";
  fl::save_checked_safetensors(streamed, deferred, kMetadata);
  fl::save_checked_safetensors(checked, tensors, kMetadata);
  EXPECT_EQ(read_bytes(streamed), read_bytes(checked));
  EXPECT_EQ(made, static_cast<int>(tensors.size()));
  EXPECT_EQ(alive_at_make, 0) << "a made tensor was still alive when the next was made";
  expect_same(fl::load_safetensors(streamed).tensors, tensors);  // the checksums check out
  // Without writing (another process of a collective save): every tensor made, in order, no file.
  made = 0;
  fl::save_checked_safetensors(dir_ / "not_written.safetensors", deferred, kMetadata, /*write=*/false);
  EXPECT_EQ(made, static_cast<int>(tensors.size()));
  EXPECT_FALSE(fs::exists(dir_ / "not_written.safetensors"));
  // A tensor made otherwise than promised is an error naming it, and leaves no file.
  deferred.front().shape.push_back(1);
  EXPECT_THROW(fl::save_checked_safetensors(dir_ / "bad.safetensors", deferred, kMetadata), fl::CheckpointError);
  EXPECT_FALSE(fs::exists(dir_ / "bad.safetensors"));
}
