// fastlearn::parallel_for: every item once, on LibTorch's threads (two of them when at::get_num_threads() says 2),
// ranges no shorter than the grain, the calling thread alone inside a parallel region, and a range's exception
// rethrown to the caller.
#include <fastlearn/core/detail/parallel.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <mutex>
#include <set>
#include <stdexcept>
#include <thread>
#include <vector>

namespace {

struct ThreadCount {
  explicit ThreadCount(int n) : before(at::get_num_threads()) { at::set_num_threads(n); }
  ~ThreadCount() { at::set_num_threads(before); }
  int before;
};

TEST(ParallelFor, CoversTheRangeOnceWithRangesNoShorterThanTheGrain) {
  const ThreadCount two(2);
  for (const std::int64_t grain : {1, 7, 50, 1000}) {
    std::vector<std::atomic<int>> seen(100);
    std::mutex m;
    std::vector<std::pair<std::int64_t, std::int64_t>> ranges;
    fastlearn::parallel_for(3, 103, grain, [&](std::int64_t first, std::int64_t last) {
      for (auto i = first; i < last; ++i) ++seen[i - 3];
      const std::lock_guard lock(m);
      ranges.emplace_back(first, last);
    });
    for (const auto& count : seen) EXPECT_EQ(count, 1) << grain;
    EXPECT_EQ(ranges.size(), grain >= 100 ? 1U : 2U) << grain;
    for (const auto& [first, last] : ranges) EXPECT_EQ(last - first, grain >= 100 ? 100 : 50) << grain;
  }
  // 9 items, grain 8: at most ceil(9 / 8) = 2 ranges, of sizes that differ by at most one.
  std::vector<std::int64_t> sizes;
  std::mutex m;
  fastlearn::parallel_for(0, 9, 8, [&](std::int64_t first, std::int64_t last) {
    const std::lock_guard lock(m);
    sizes.push_back(last - first);
  });
  std::sort(sizes.begin(), sizes.end());
  EXPECT_EQ(sizes, (std::vector<std::int64_t>{4, 5}));
  bool called = false;
  fastlearn::parallel_for(5, 5, 1, [&](std::int64_t, std::int64_t) { called = true; });
  EXPECT_FALSE(called);
}

TEST(ParallelFor, RunsOnTwoThreadsAndSaysItIsInAParallelRegion) {
  const ThreadCount two(2);
  std::mutex m;
  std::set<std::thread::id> threads;
  std::set<int> thread_numbers;
  std::atomic<int> nested_ranges{0};
  fastlearn::parallel_for(0, 2, 1, [&](std::int64_t, std::int64_t) {
    EXPECT_TRUE(at::in_parallel_region());
    // A parallel_for inside runs its whole range on this thread.
    fastlearn::parallel_for(0, 10, 1, [&](std::int64_t first, std::int64_t last) {
      EXPECT_EQ(last - first, 10);
      ++nested_ranges;
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(20));  // both shares are under way at once
    const std::lock_guard lock(m);
    threads.insert(std::this_thread::get_id());
    thread_numbers.insert(at::get_thread_num());
  });
  EXPECT_EQ(threads.size(), 2U);
  EXPECT_EQ(thread_numbers, (std::set<int>{0, 1}));
  EXPECT_EQ(nested_ranges, 2);
  EXPECT_FALSE(at::in_parallel_region());
}

TEST(ParallelFor, WorksFromAThreadOtherThanMain) {
  const ThreadCount two(2);
  std::atomic<std::int64_t> sum{0};
  std::thread([&] {
    fastlearn::parallel_for(0, 1000, 10, [&](std::int64_t first, std::int64_t last) {
      for (auto i = first; i < last; ++i) sum += i;
    });
  }).join();
  EXPECT_EQ(sum, 499500);
}

TEST(ParallelFor, OneThreadRunsTheWholeRangeOnTheCaller) {
  const ThreadCount one(1);
  std::vector<std::pair<std::int64_t, std::int64_t>> ranges;
  const auto caller = std::this_thread::get_id();
  fastlearn::parallel_for(0, 1000, 1, [&](std::int64_t first, std::int64_t last) {
    EXPECT_EQ(std::this_thread::get_id(), caller);
    ranges.emplace_back(first, last);
  });
  EXPECT_EQ(ranges, (std::vector<std::pair<std::int64_t, std::int64_t>>{{0, 1000}}));
}

TEST(ParallelFor, AnExceptionOfARangeReachesTheCaller) {
  const ThreadCount two(2);
  EXPECT_THROW(fastlearn::parallel_for(0, 100, 1,
                                       [](std::int64_t first, std::int64_t) {
                                         if (first > 0) throw std::runtime_error("second share");
                                       }),
               std::runtime_error);
  // The team is usable afterwards.
  std::atomic<std::int64_t> sum{0};
  fastlearn::parallel_for(0, 100, 1, [&](std::int64_t first, std::int64_t last) {
    for (auto i = first; i < last; ++i) sum += i;
  });
  EXPECT_EQ(sum, 4950);
}

}  // namespace
