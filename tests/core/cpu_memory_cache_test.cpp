// The CPU memory cache: freed large blocks come back for the next tensor of their size, never while a
// tensor holds them; small ones are not cached; the limit and empty_cpu_memory_cache return memory. The CPU memory
// counter over it: the bytes alive and the peak.
#include <fastlearn/core/cpu_memory_cache.h>
#include <fastlearn/core/cpu_memory_counter.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdlib>

namespace fl = fastlearn;

namespace {

constexpr std::int64_t kMiB = std::int64_t{1} << 20;

}  // namespace

TEST(CpuMemoryCache, AFreedLargeBlockServesTheNextTensorOfItsSizeAndNoneWhileHeld) {
  ASSERT_TRUE(fl::enable_cpu_memory_cache());
  fl::empty_cpu_memory_cache();
  auto a = torch::ones({4 * kMiB}, torch::kFloat32);  // 16 MiB
  const auto* a_memory = a.data_ptr();
  auto b = torch::empty({4 * kMiB}, torch::kFloat32);
  EXPECT_NE(b.data_ptr(), a_memory) << "a block still held by a tensor was handed out again";
  b.fill_(2);
  EXPECT_EQ(a.sum().item<double>(), 4.0 * kMiB) << "filling the second tensor changed the first";
  const auto before = fl::cpu_memory_cache_stats();
  a = at::Tensor();
  EXPECT_EQ(fl::cpu_memory_cache_stats().cached_bytes, before.cached_bytes + 16 * kMiB);
  auto c = torch::empty({16 * kMiB - 100}, torch::kByte);  // rounds up to the same size
  EXPECT_EQ(c.data_ptr(), a_memory);
  EXPECT_EQ(fl::cpu_memory_cache_stats().hits, before.hits + 1);
  // Small tensors are not cached.
  const auto cached = fl::cpu_memory_cache_stats().cached_bytes;
  { auto small = torch::empty({1000}, torch::kFloat32); }
  EXPECT_EQ(fl::cpu_memory_cache_stats().cached_bytes, cached);
  // Tensors of every size keep working through the cache (a zero-size one too).
  EXPECT_EQ(torch::arange(3 * kMiB, torch::kLong).sum().item<std::int64_t>(), 3 * kMiB * (3 * kMiB - 1) / 2);
  EXPECT_EQ(torch::empty({0}).numel(), 0);
}

TEST(CpuMemoryCache, TheLimitAndEmptyingReturnMemoryToTheSystem) {
  ASSERT_TRUE(fl::enable_cpu_memory_cache());
  fl::set_cpu_memory_cache_limit(8 * kMiB);
  fl::empty_cpu_memory_cache();
  {
    auto a = torch::empty({2 * kMiB}, torch::kFloat32);  // 8 MiB: fits the limit once freed
    auto b = torch::empty({kMiB}, torch::kFloat32);      // 4 MiB more would pass it: returned at once
  }
  auto stats = fl::cpu_memory_cache_stats();
  EXPECT_LE(stats.cached_bytes, 8u * kMiB);
  EXPECT_GT(stats.cached_bytes, 0u);
  fl::set_cpu_memory_cache_limit(4 * kMiB);  // trims what is cached past the new limit
  EXPECT_LE(fl::cpu_memory_cache_stats().cached_bytes, 4u * kMiB);
  fl::empty_cpu_memory_cache();
  EXPECT_EQ(fl::cpu_memory_cache_stats().cached_bytes, 0u);
  EXPECT_EQ(fl::cpu_memory_cache_stats().limit_bytes, 4u * kMiB) << "emptying keeps the limit";
}

TEST(CpuMemoryCache, ZeroInTheEnvironmentLeavesItOff) {
  if (fl::cpu_memory_cache_stats().limit_bytes != 0)
    GTEST_SKIP() << "the cache is already on in this process (ctest runs each test in a process of its own)";
  ASSERT_EQ(::setenv("FASTLEARN_CPU_MEMORY_CACHE_MB", "0", 1), 0);
  EXPECT_FALSE(fl::enable_cpu_memory_cache());
  auto a = torch::empty({4 * kMiB}, torch::kFloat32);
  a = at::Tensor();
  EXPECT_EQ(fl::cpu_memory_cache_stats().cached_bytes, 0u);
  EXPECT_EQ(fl::cpu_memory_cache_stats().misses, 0u);
}

// Counted: every tensor allocated from then on, small and large, while it lives, and the most alive at once; the
// cache still serves under the counter (the Learner turning it on later leaves the counter in place).
TEST(CpuMemoryCounter, CountsTheBytesAliveAndThePeak) {
  EXPECT_FALSE(fl::counting_cpu_memory());
  fl::count_cpu_memory();
  ASSERT_TRUE(fl::counting_cpu_memory());
  const auto start = fl::cpu_memory_count();
  {
    auto large = torch::empty({kMiB}, torch::kFloat32);  // 4 MiB
    auto small = torch::empty({1000}, torch::kFloat32);
    EXPECT_EQ(fl::cpu_memory_count().current_bytes - start.current_bytes, 4 * kMiB + 4000);
  }
  EXPECT_EQ(fl::cpu_memory_count().current_bytes, start.current_bytes);
  EXPECT_GE(fl::cpu_memory_count().peak_bytes, start.current_bytes + 4 * kMiB + 4000);
  fl::reset_cpu_memory_peak();
  EXPECT_EQ(fl::cpu_memory_count().peak_bytes, fl::cpu_memory_count().current_bytes);
  ASSERT_TRUE(fl::enable_cpu_memory_cache());
  const auto hits = fl::cpu_memory_cache_stats().hits;
  { auto again = torch::ones({kMiB}, torch::kFloat32); }
  { auto once_more = torch::ones({kMiB}, torch::kFloat32); }
  EXPECT_GT(fl::cpu_memory_cache_stats().hits, hits) << "the cache serves under the counter";
  EXPECT_EQ(fl::cpu_memory_count().current_bytes, start.current_bytes);
  EXPECT_EQ(torch::arange(3 * kMiB, torch::kLong).sum().item<std::int64_t>(), 3 * kMiB * (3 * kMiB - 1) / 2);
}
