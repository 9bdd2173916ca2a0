// The IDX reader and writer: round trips of every element type, clear errors on bad files, and the
// real Fashion-MNIST files. The .npy reader and writer (numpy's own files: tests/c, `fastlearn predict`): round trips
// and bad files.
#include <fastlearn/core/error.h>
#include <fastlearn/data/idx.h>
#include <fastlearn/data/npy.h>

#include <gtest/gtest.h>
#include <torch/torch.h>
#include <zlib.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace fl = fastlearn;
namespace fs = std::filesystem;

namespace {

class Idx : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("fastlearn-idx-" + std::to_string(getpid()) + "-" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  void write_bytes(const fs::path& path, const std::vector<std::uint8_t>& bytes) {
    std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(bytes.data()), bytes.size());
  }

  // Expects read_idx(path) to throw a DataError whose message contains every one of `parts`.
  void expect_error(const fs::path& path, std::initializer_list<std::string> parts) {
    try {
      auto t = fl::read_idx(path);
      ADD_FAILURE() << "read_idx accepted " << path << " as shape " << t.sizes();
    } catch (const fl::DataError& e) {
      for (const auto& part : parts)
        EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << "missing '" << part << "' in: " << e.what();
    }
  }

  fs::path dir_;
};

TEST_F(Idx, EveryElementTypeRoundTripsRawAndGzipped) {
  const std::vector<torch::Tensor> tensors{torch::randint(0, 256, {5, 3, 2}, torch::kUInt8),
                                           torch::randint(-128, 128, {7}, torch::kInt8),
                                           torch::randint(-30000, 30000, {4, 4}, torch::kInt16),
                                           torch::randint(-2000000000, 2000000000, {3, 5}, torch::kInt32),
                                           torch::randn({2, 3, 4, 5}, torch::kFloat32),
                                           torch::randn({6, 1}, torch::kFloat64)};
  for (const auto& name : {"t.idx", "t.idx.gz"}) {
    for (const auto& t : tensors) {
      const auto path = dir_ / name;
      fl::write_idx(path, t);
      const auto back = fl::read_idx(path);
      EXPECT_EQ(back.scalar_type(), t.scalar_type()) << name;
      EXPECT_TRUE(torch::equal(back, t)) << name << " " << t.scalar_type();
    }
  }
}

TEST_F(Idx, RawFilesAreBigEndianAsTheFormatSays) {
  fl::write_idx(dir_ / "a.idx", torch::tensor({1, 258}, torch::kInt32));
  std::ifstream in(dir_ / "a.idx", std::ios::binary);
  std::vector<std::uint8_t> bytes((std::istreambuf_iterator<char>(in)), {});
  const std::vector<std::uint8_t> expected{0, 0, 0x0C, 1, 0, 0, 0, 2, 0, 0, 0, 1, 0, 0, 1, 2};
  EXPECT_EQ(bytes, expected);
}

TEST_F(Idx, BadMagicIsRejectedWithFileAndOffset) {
  write_bytes(dir_ / "bad.idx", {0x50, 0x4B, 0x03, 0x04, 0, 0, 0, 0});
  expect_error(dir_ / "bad.idx", {"bad.idx", "bad magic", "offset 0"});
  write_bytes(dir_ / "type.idx", {0, 0, 0x0A, 1, 0, 0, 0, 1, 0});
  expect_error(dir_ / "type.idx", {"type.idx", "bad magic"});
}

TEST_F(Idx, TruncatedDataNamesTheOffsetWhereItEnds) {
  fl::write_idx(dir_ / "full.idx", torch::zeros({10, 4}, torch::kUInt8));
  std::ifstream in(dir_ / "full.idx", std::ios::binary);
  std::vector<std::uint8_t> bytes((std::istreambuf_iterator<char>(in)), {});
  bytes.resize(bytes.size() - 15);  // header is 12 bytes, data 40: keep 25 of the 40
  write_bytes(dir_ / "short.idx", bytes);
  expect_error(dir_ / "short.idx", {"short.idx", "truncated at byte offset 37", "15 more byte(s)"});
  write_bytes(dir_ / "header.idx", {0, 0, 8, 2, 0, 0});
  expect_error(dir_ / "header.idx", {"header.idx", "truncated at byte offset 6", "2 more byte(s) of dimension 0"});
}

TEST_F(Idx, TrailingBytesAreAnError) {
  fl::write_idx(dir_ / "x.idx", torch::zeros({3}, torch::kUInt8));
  std::ofstream(dir_ / "x.idx", std::ios::binary | std::ios::app) << "junk";
  expect_error(dir_ / "x.idx", {"x.idx", "unexpected bytes after the data", "offset 11"});
}

TEST_F(Idx, AnAbsurdShapeIsACorruptHeaderNotAnAllocation) {
  write_bytes(dir_ / "huge.idx", {0, 0, 8, 3, 0x7f, 0xff, 0xff, 0xff, 0x7f, 0xff, 0xff, 0xff, 0x7f, 0xff, 0xff, 0xff});
  expect_error(dir_ / "huge.idx", {"huge.idx", "header is corrupt"});
  write_bytes(dir_ / "rank.idx", {0, 0, 8, 0});
  expect_error(dir_ / "rank.idx", {"rank.idx", "rank 0"});
}

TEST_F(Idx, CorruptGzipIsAnErrorNotGarbage) {
  fl::write_idx(dir_ / "z.idx.gz", torch::arange(0, 200000, torch::kInt32));
  std::fstream f(dir_ / "z.idx.gz", std::ios::binary | std::ios::in | std::ios::out);
  f.seekp(400);
  const char noise[64] = "this is not deflate data, this is not deflate data, not at all";
  f.write(noise, sizeof noise);
  f.close();
  expect_error(dir_ / "z.idx.gz", {"z.idx.gz"});
}

TEST_F(Idx, MissingFileIsAnError) { expect_error(dir_ / "nope.idx", {"nope.idx", "cannot open"}); }

TEST_F(Idx, WriterRejectsTypesIdxCannotHold) {
  EXPECT_THROW(fl::write_idx(dir_ / "b.idx", torch::zeros({2}, torch::kBool)), fl::DataError);
  EXPECT_FALSE(fs::exists(dir_ / "b.idx"));
}

TEST(FashionMnist, TheDebianFilesReadAsSixtyAndTenThousandImages) {
  const fs::path dir = "/usr/share/datasets/fashion-mnist";
  ASSERT_TRUE(fs::exists(dir / "train-images-idx3-ubyte.gz"))
      << "Fashion-MNIST is missing: scripts/bootstrap installs Debian's dataset-fashion-mnist";
  const auto train_x = fl::read_idx(dir / "train-images-idx3-ubyte.gz");
  const auto train_y = fl::read_idx(dir / "train-labels-idx1-ubyte.gz");
  const auto test_x = fl::read_idx(dir / "t10k-images-idx3-ubyte.gz");
  const auto test_y = fl::read_idx(dir / "t10k-labels-idx1-ubyte.gz");
  EXPECT_EQ(train_x.sizes(), (std::vector<std::int64_t>{60000, 28, 28}));
  EXPECT_EQ(test_x.sizes(), (std::vector<std::int64_t>{10000, 28, 28}));
  EXPECT_EQ(train_y.sizes(), (std::vector<std::int64_t>{60000}));
  EXPECT_EQ(test_y.sizes(), (std::vector<std::int64_t>{10000}));
  EXPECT_EQ(train_x.scalar_type(), torch::kUInt8);
  // Balanced classes: exactly 6000 training and 1000 test images of each of the 10 classes.
  EXPECT_TRUE(torch::equal(torch::bincount(train_y.to(torch::kLong)), torch::full({10}, 6000, torch::kLong)));
  EXPECT_TRUE(torch::equal(torch::bincount(test_y.to(torch::kLong)), torch::full({10}, 1000, torch::kLong)));
}

}  // namespace

namespace {

std::string npy_error(const std::string& bytes) {
  try {
    fl::parse_npy(bytes, "x.npy");
  } catch (const fl::DataError& e) {
    return e.what();
  }
  return "accepted";
}

std::string npy_file(const std::string& header, const std::string& data) {
  std::string h = header;
  const std::size_t total = 10 + h.size() + 1;
  h.append((64 - total % 64) % 64, ' ');
  h += '\n';
  return std::string("\x93NUMPY\x01\x00", 8) + static_cast<char>(h.size() & 0xFF) + static_cast<char>(h.size() >> 8) +
         h + data;
}

}  // namespace

TEST(Npy, EveryTypeItWritesRoundTrips) {
  for (const auto type : {torch::kFloat32, torch::kFloat64, torch::kInt8, torch::kUInt8, torch::kInt16, torch::kInt32,
                          torch::kInt64, torch::kBool}) {
    for (const auto& shape : std::vector<std::vector<std::int64_t>>{{}, {5}, {2, 3}, {2, 0, 4}}) {
      const auto t = (torch::randn(shape) * 50).to(type);
      const auto back = fl::parse_npy(fl::serialize_npy(t), "t.npy");
      EXPECT_EQ(back.scalar_type(), type);
      EXPECT_TRUE(torch::equal(back, t)) << c10::toString(type) << " " << t.sizes();
    }
  }
  const auto bytes = fl::serialize_npy(torch::zeros({2, 3}));
  EXPECT_EQ(bytes.find("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }"), 10u);
  EXPECT_EQ((bytes.size() - 24) % 64, 0u) << "the data starts 64-byte aligned, as numpy.save writes it";
}

TEST(Npy, FortranOrderAndBigEndianReadAsTheArray) {
  const std::vector<double> column_major{1, 4, 2, 5, 3, 6};  // the 2 x 3 array [[1, 2, 3], [4, 5, 6]]
  std::string big;
  for (const double v : column_major) {
    char b[8];
    std::memcpy(b, &v, 8);
    std::reverse(b, b + 8);
    big.append(b, 8);
  }
  const auto t = fl::parse_npy(npy_file("{'descr': '>f8', 'fortran_order': True, 'shape': (2, 3), }", big), "f.npy");
  EXPECT_TRUE(torch::equal(t, torch::tensor({{1., 2., 3.}, {4., 5., 6.}}, torch::kFloat64)));
  const std::uint16_t high = 0xFFFE;
  const auto u16 = fl::parse_npy(npy_file("{'descr': '<u2', 'fortran_order': False, 'shape': (1,), }",
                                          std::string(reinterpret_cast<const char*>(&high), 2)),
                                 "u.npy");
  EXPECT_EQ(u16.scalar_type(), torch::kInt32);
  EXPECT_EQ(u16.item<int>(), 0xFFFE);
}

TEST(Npy, BadFilesAreRefusedWithTheFileAndNothingAllocatedFromTheirClaims) {
  const std::string header = "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }";
  EXPECT_NE(npy_error(npy_file(header, std::string(20, '\0'))).find("24 bytes of data, and the file has 20"),
            std::string::npos);
  EXPECT_NE(npy_error(npy_file(header, std::string(28, '\0'))).find("the file has 28"), std::string::npos);
  EXPECT_NE(npy_error(npy_file("{'descr': '<f4', 'fortran_order': False, 'shape': (4000000000, 4000000000, 9), }", ""))
                .find("holds more elements than any file"),
            std::string::npos);
  EXPECT_NE(
      npy_error(npy_file("{'descr': '|O', 'fortran_order': False, 'shape': (1,), }", "12345678")).find("no objects"),
      std::string::npos);
  EXPECT_NE(npy_error(npy_file("{'descr': '<f4', 'shape': (1,), }", "1234")).find("no 'fortran_order'"),
            std::string::npos);
  EXPECT_NE(npy_error(npy_file("{'descr': '<f4', 'fortran_order': False, 'shape': (-1,), }", "")).find("'-1'"),
            std::string::npos);
  EXPECT_NE(npy_error("not numpy").find("x.npy: not a .npy file"), std::string::npos);
  std::string huge_header = npy_file(header, "");
  huge_header[8] = '\xFF';
  huge_header[9] = '\xFF';
  EXPECT_NE(npy_error(huge_header).find("a header of 65535 bytes"), std::string::npos);
}
