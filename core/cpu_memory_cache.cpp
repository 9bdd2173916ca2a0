#include <fastlearn/core/cpu_memory_cache.h>

#include <c10/core/CPUAllocator.h>
#include <c10/core/impl/alloc_cpu.h>

#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

namespace fastlearn {
namespace {

constexpr std::size_t kCachedFrom = std::size_t{1} << 20;  // smaller blocks: malloc reuses them well enough
constexpr std::size_t kGranule = std::size_t{1} << 16;     // sizes round up to this, so near sizes share blocks

class CpuMemoryCache final : public c10::Allocator {
 public:
  // Never destroyed: tensors may be freed during static destruction, after any destructor would have run.
  static CpuMemoryCache& instance() {
    static auto* cache = new CpuMemoryCache;
    return *cache;
  }

  c10::DataPtr allocate(std::size_t n) override {
    if (n < kCachedFrom) return wrap(c10::alloc_cpu(n));
    const std::size_t size = (n + kGranule - 1) / kGranule * kGranule;
    {
      std::lock_guard lock(mutex_);
      auto& blocks = free_[size];
      if (!blocks.empty()) {
        void* block = blocks.back();
        blocks.pop_back();
        stats_.cached_bytes -= size;
        stats_.in_use_bytes += size;
        ++stats_.hits;
        return wrap(block);
      }
    }
    void* block = c10::alloc_cpu(size);
    std::lock_guard lock(mutex_);
    sizes_[block] = size;
    stats_.in_use_bytes += size;
    ++stats_.misses;
    return wrap(block);
  }

  c10::DeleterFnPtr raw_deleter() const override { return &release; }

  void copy_data(void* dest, const void* src, std::size_t count) const override { std::memcpy(dest, src, count); }

  CpuMemoryCacheStats stats() {
    std::lock_guard lock(mutex_);
    return stats_;
  }

  void set_limit(std::size_t bytes) {
    std::lock_guard lock(mutex_);
    stats_.limit_bytes = bytes;
    trim_locked();
  }

  // Frees every cached block; the limit stays.
  void empty() {
    std::lock_guard lock(mutex_);
    const auto limit = stats_.limit_bytes;
    stats_.limit_bytes = 0;
    trim_locked();
    stats_.limit_bytes = limit;
  }

 private:
  static c10::DataPtr wrap(void* block) { return {block, block, &release, c10::Device(c10::DeviceType::CPU)}; }

  static void release(void* block) { instance().give_back(block); }

  void give_back(void* block) {
    std::lock_guard lock(mutex_);
    const auto found = sizes_.find(block);
    if (found == sizes_.end()) {  // a small block
      c10::free_cpu(block);
      return;
    }
    const std::size_t size = found->second;
    stats_.in_use_bytes -= size;
    if (stats_.cached_bytes + size > stats_.limit_bytes) {
      sizes_.erase(found);
      c10::free_cpu(block);
      return;
    }
    free_[size].push_back(block);
    stats_.cached_bytes += size;
  }

  // Frees cached blocks, largest first, until the cache fits its limit.
  void trim_locked() {
    for (auto it = free_.rbegin(); it != free_.rend() && stats_.cached_bytes > stats_.limit_bytes; ++it) {
      auto& blocks = it->second;
      while (!blocks.empty() && stats_.cached_bytes > stats_.limit_bytes) {
        sizes_.erase(blocks.back());
        c10::free_cpu(blocks.back());
        blocks.pop_back();
        stats_.cached_bytes -= it->first;
      }
    }
  }

  std::mutex mutex_;
  std::map<std::size_t, std::vector<void*>> free_;  // by size
  std::unordered_map<void*, std::size_t> sizes_;    // every large block, cached or in use
  CpuMemoryCacheStats stats_;
};

std::size_t limit_from_environment() {
  const char* text = std::getenv("FASTLEARN_CPU_MEMORY_CACHE_MB");
  if (!text || !*text) return std::size_t{2048} << 20;
  char* end = nullptr;
  const auto mb = std::strtoull(text, &end, 10);
  return *end == '\0' ? static_cast<std::size_t>(mb) << 20 : std::size_t{2048} << 20;
}

}  // namespace

bool enable_cpu_memory_cache() {
  static const bool on = [] {
    const auto limit = limit_from_environment();
    if (limit == 0) return false;
    auto& cache = CpuMemoryCache::instance();
    cache.set_limit(limit);
    // Above the default allocator's priority (0), so that it is c10's CPU allocator from now on.
    c10::SetCPUAllocator(&cache, /*priority=*/1);
    return true;
  }();
  return on;
}

CpuMemoryCacheStats cpu_memory_cache_stats() { return CpuMemoryCache::instance().stats(); }

void empty_cpu_memory_cache() { CpuMemoryCache::instance().empty(); }

void set_cpu_memory_cache_limit(std::size_t bytes) { CpuMemoryCache::instance().set_limit(bytes); }

}  // namespace fastlearn
