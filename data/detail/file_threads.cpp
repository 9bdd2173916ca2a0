#include <fastlearn/core/detail/parallel.h>
#include <fastlearn/data/detail/file_threads.h>

#include <algorithm>
#include <atomic>
#include <thread>
#include <vector>

namespace fastlearn {

void for_each_file(std::size_t n, int threads, const std::function<void(std::size_t)>& body) {
  const int n_threads = std::max(1, threads > 0 ? threads : static_cast<int>(std::thread::hardware_concurrency()));
  std::atomic<std::size_t> next{0};
  auto work = [&] {
    for (std::size_t i; (i = next.fetch_add(1)) < n;) body(i);
  };
  std::vector<std::thread> pool;
  for (int t = 1; t < n_threads; ++t)
    pool.emplace_back([&] {
      compute_alone();
      work();
    });
  work();
  for (auto& t : pool) t.join();
}

}  // namespace fastlearn
