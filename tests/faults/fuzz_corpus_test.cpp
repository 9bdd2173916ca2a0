// The fuzz targets' seed corpus and every input a fuzzer once crashed on (tests/fuzz/regressions), run
// through the same parsers in the normal build: each gives a value or the parser's own error type.
#include <fastlearn/core/error.h>
#include <fastlearn/core/safetensors.h>
#include <fastlearn/data/csv.h>
#include <fastlearn/data/idx.h>
#include <fastlearn/data/image_decode.h>
#include <fastlearn/data/tabular_procs.h>

#include <fastlearn/config/train_config.h>

#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <numeric>
#include <string>
#include <vector>

#include "support/build_paths.h"

namespace {

namespace fl = fastlearn;
namespace fs = std::filesystem;

const fs::path kFuzz = fs::path(FASTLEARN_SOURCE_DIR) / "tests" / "fuzz";

std::vector<fs::path> inputs(const std::string& target) {
  std::vector<fs::path> files;
  for (const char* kind : {"corpus", "regressions"}) {
    const auto dir = kFuzz / kind / target;
    if (!fs::is_directory(dir)) continue;
    for (const auto& e : fs::directory_iterator(dir)) files.push_back(e.path());
  }
  return files;
}

std::string bytes_of(const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

TEST(FuzzCorpus, IdxInputsParseOrFailWithDataError) {
  const auto files = inputs("idx");
  ASSERT_FALSE(files.empty());
  for (const auto& file : files) {
    try {
      fl::parse_idx(bytes_of(file), file.string());
    } catch (const fl::DataError&) {
    } catch (const std::exception& e) {
      ADD_FAILURE() << file << ": " << e.what();
    }
  }
  EXPECT_NO_THROW(fl::parse_idx(bytes_of(kFuzz / "corpus" / "idx" / "labels_gz"), "labels_gz"));
  // Found by idx_fuzz: a zero dimension followed by huge ones reached torch::empty, whose c10::Error escaped.
  EXPECT_THROW(fl::parse_idx(bytes_of(kFuzz / "regressions" / "idx" / "crash_zero_dim_then_huge_dims"), "crash"),
               fl::DataError);
}

TEST(FuzzCorpus, AHeaderClaimingGigabytesIsATruncationNotAnAllocation) {
  // 2^48 elements declared, 16 bytes present: the error comes before any allocation of that size.
  const auto start = std::chrono::steady_clock::now();
  try {
    fl::parse_idx(bytes_of(kFuzz / "regressions" / "idx" / "huge_header_no_data"), "huge");
    ADD_FAILURE() << "parsed";
  } catch (const fl::DataError& e) {
    EXPECT_NE(std::string(e.what()).find("describe more than"), std::string::npos) << e.what();
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(1));
  std::string claim{'\0', '\0', '\x08', '\x01', '\x7f', '\xff', '\xff', '\xff'};  // 2 GiB of uint8 claimed
  try {
    fl::parse_idx(claim + "abc", "claim");
    ADD_FAILURE() << "parsed";
  } catch (const fl::DataError& e) {
    EXPECT_NE(std::string(e.what()).find("truncated at byte offset 11"), std::string::npos) << e.what();
  }
}

TEST(FuzzCorpus, ImageInputsDecodeOrFailWithDataError) {
  const auto files = inputs("image");
  ASSERT_FALSE(files.empty());
  int decoded = 0;
  for (const auto& file : files) {
    try {
      const auto image = fl::read_image(file);
      EXPECT_EQ(image.size(0), 3) << file;
      ++decoded;
    } catch (const fl::DataError&) {
    } catch (const std::exception& e) {
      ADD_FAILURE() << file << ": " << e.what();
    }
  }
  EXPECT_GE(decoded, 9) << "the seeds (one file per JPEG / PNG kind) all decode";
}

TEST(FuzzCorpus, CsvInputsParseAndFitProcsOrFailWithDataError) {
  const auto files = inputs("csv");
  ASSERT_FALSE(files.empty());
  int fitted = 0;
  for (const auto& file : files) {
    try {
      const auto table = fl::parse_csv(bytes_of(file), file.string());
      if (table.columns.size() < 2) continue;
      std::vector<std::int64_t> rows(table.rows.size());
      std::iota(rows.begin(), rows.end(), 0);
      const auto procs = fl::TabularProcs::fit(
          table, rows, {.cat_names = {table.columns[0]}, .cont_names = {table.columns[1]}}, file.string());
      const auto x = procs.encode(table, rows, file.string());
      EXPECT_EQ(x.cats.size(0), static_cast<std::int64_t>(rows.size())) << file;
      EXPECT_EQ(fl::TabularProcs::from_json(procs.to_json(), "json"), procs) << file;
      ++fitted;
    } catch (const fl::DataError&) {
    } catch (const fl::ConfigError&) {
    } catch (const std::exception& e) {
      ADD_FAILURE() << file << ": " << e.what();
    }
  }
  EXPECT_GE(fitted, 2) << "the well-formed seeds with a numeric second column fit";
}

TEST(FuzzCorpus, SafetensorsInputsParseOrFailWithCheckpointError) {
  const auto files = inputs("safetensors");
  ASSERT_FALSE(files.empty());
  for (const auto& file : files) {
    try {
      const auto content = fl::parse_safetensors(bytes_of(file), file.string());
      const auto again = fl::parse_safetensors(fl::serialize_safetensors(content.tensors, content.metadata), "again");
      EXPECT_EQ(again.tensors.size(), content.tensors.size()) << file;
    } catch (const fl::CheckpointError&) {
    } catch (const std::exception& e) {
      ADD_FAILURE() << file << ": " << e.what();
    }
  }
}

}  // namespace

TEST(FuzzCorpus, ConfigInputsLoadOrFailWithConfigErrorAndRoundTrip) {
  const auto files = inputs("config");
  ASSERT_FALSE(files.empty());
  for (const auto& file : files) {
    try {
      const auto config = fastlearn::parse_config(bytes_of(file), file.string());
      EXPECT_EQ(fastlearn::parse_config(fastlearn::to_toml(config), "resolved.toml"), config) << file;
    } catch (const fl::ConfigError&) {
    } catch (const std::exception& e) {
      ADD_FAILURE() << file << ": " << e.what();
    }
  }
}
