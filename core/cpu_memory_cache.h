#pragma once
// A cache of large CPU memory blocks for tensors, as PyTorch's CUDA allocator caches GPU memory. glibc
// hands blocks of a few megabytes and more back to the kernel when they are freed, and the kernel maps and
// zeroes every page again at the next allocation: a training step that makes and frees hundreds of
// megabytes of activations spends part of its time in page faults on a CPU (bench cpu_memory_cache
// measures the difference). Installed as c10's CPU allocator, the cache keeps freed blocks of
// 1 MiB and more (sizes rounded up to 64 KiB) for the next request of the same size, up to a limit
// of cached bytes; smaller requests go straight to c10's aligned allocation. The Learner turns it on;
// FASTLEARN_CPU_MEMORY_CACHE_MB sets the limit (default 2048; 0 turns the cache off).
#include <cstddef>

namespace fastlearn {

/// Installs the cache as c10's CPU allocator (once; later calls change nothing). Tensors made before keep
/// their own allocator. Returns whether the cache is on (off when FASTLEARN_CPU_MEMORY_CACHE_MB=0).
bool enable_cpu_memory_cache();

struct CpuMemoryCacheStats {
  std::size_t cached_bytes = 0;  ///< free blocks held for reuse
  std::size_t in_use_bytes = 0;  ///< blocks of 1 MiB and more held by tensors
  std::size_t limit_bytes = 0;   ///< most cached bytes; freeing past it returns the block to the system
  std::size_t hits = 0;          ///< requests served from the cache
  std::size_t misses = 0;        ///< requests of 1 MiB and more that allocated
};

CpuMemoryCacheStats cpu_memory_cache_stats();

/// Returns every cached block to the system (blocks in use stay where they are).
void empty_cpu_memory_cache();

/// Sets the most bytes kept cached; blocks past it are returned at once.
void set_cpu_memory_cache_limit(std::size_t bytes);

}  // namespace fastlearn
