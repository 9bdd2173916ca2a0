// fastlearn::warn: printed by a single process and by rank 0 of a job, kept back by the other ranks (which read
// the same data and would print the same warning). rethrow_with_context: an error from another thread keeps its kind.
#include <fastlearn/core/detail/error_context.h>
#include <fastlearn/core/detail/warning.h>
#include <fastlearn/core/error.h>
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <cstdlib>
#include <exception>
#include <stdexcept>
#include <string>

namespace {

std::string warned_with_rank(const char* rank) {
  if (rank) {
    setenv("RANK", rank, 1);
  } else {
    unsetenv("RANK");
  }
  testing::internal::CaptureStderr();
  fastlearn::warn("3 image(s) left out");
  unsetenv("RANK");
  return testing::internal::GetCapturedStderr();
}

TEST(Warn, OneProcessAndRankZeroPrintTheOtherRanksDoNot) {
  EXPECT_EQ(warned_with_rank(nullptr), "fastlearn: warning: 3 image(s) left out\n");
  EXPECT_EQ(warned_with_rank("0"), "fastlearn: warning: 3 image(s) left out\n");
  EXPECT_EQ(warned_with_rank(""), "fastlearn: warning: 3 image(s) left out\n");
  EXPECT_EQ(warned_with_rank("1"), "");
  EXPECT_EQ(warned_with_rank("7"), "");
}

}  // namespace

namespace {

template <class Thrown>
std::exception_ptr captured(Thrown error) {
  try {
    throw error;
  } catch (...) {
    return std::current_exception();
  }
}

}  // namespace

TEST(RethrowWithContext, EachKindStaysItsKindWithTheContextInFront) {
  using fastlearn::rethrow_with_context;
  try {
    rethrow_with_context(captured(fastlearn::DataError("bad row")), "replica 1");
  } catch (const fastlearn::DataError& e) {
    EXPECT_STREQ(e.what(), "replica 1: bad row");
  }
  try {
    rethrow_with_context(captured(fastlearn::ConfigFileError("bad key", "train.lr", 3, 7)), "replica 0");
  } catch (const fastlearn::ConfigFileError& e) {
    EXPECT_STREQ(e.what(), "replica 0: bad key");
    EXPECT_EQ(e.key(), "train.lr");
    EXPECT_EQ(e.line(), 3);
    EXPECT_EQ(e.column(), 7);
  }
  EXPECT_THROW(rethrow_with_context(captured(fastlearn::ConfigError("x")), "c"), fastlearn::ConfigError);
  EXPECT_THROW(rethrow_with_context(captured(fastlearn::CheckpointError("x")), "c"), fastlearn::CheckpointError);
  EXPECT_THROW(rethrow_with_context(captured(fastlearn::DistributedError("x")), "c"), fastlearn::DistributedError);
  std::exception_ptr torch_error;
  try {
    (void)(at::ones({2}) + at::ones({3}));
  } catch (...) {
    torch_error = std::current_exception();
  }
  try {  // anything else is an Error; LibTorch's without its backtrace
    rethrow_with_context(torch_error, "replica 2");
  } catch (const fastlearn::DataError&) {
    ADD_FAILURE() << "a LibTorch error is no DataError";
  } catch (const fastlearn::Error& e) {
    const std::string message = e.what();
    EXPECT_EQ(message.rfind("replica 2: The size of tensor a (2)", 0), 0u) << message;
    EXPECT_EQ(message.find("Exception raised from"), std::string::npos) << message;
  }
  try {
    rethrow_with_context(captured(std::runtime_error("plain")), "replica 3");
  } catch (const fastlearn::Error& e) {
    EXPECT_STREQ(e.what(), "replica 3: plain");
  }
}
