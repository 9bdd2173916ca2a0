// fastlearn::warn: printed by a single process and by rank 0 of a job, kept back by the other ranks (which read
// the same data and would print the same warning).
#include <fastlearn/core/detail/warning.h>
#include <gtest/gtest.h>

#include <cstdlib>
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
