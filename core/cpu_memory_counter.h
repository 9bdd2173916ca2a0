#pragma once
// Counts the bytes of the CPU tensors c10 allocates: how much is held now and the most held at once, for tests and
// benchmarks that measure memory (a sharded optimizer's state per rank, say). It wraps c10's CPU allocator of the
// moment (the CPU memory cache, which it turns on first, so that the Learner's turning it on later changes nothing);
// tensors allocated before it started are not counted, nor their frees.
#include <cstddef>

namespace fastlearn {

struct CpuMemoryCount {
  std::size_t current_bytes = 0;  ///< bytes of counted tensors alive now
  std::size_t peak_bytes = 0;     ///< the most alive at once since counting started or the last reset_peak
};

/// Starts counting (once; later calls change nothing). Each allocation costs a small bookkeeping record.
void count_cpu_memory();
/// Whether count_cpu_memory() has run.
bool counting_cpu_memory();
CpuMemoryCount cpu_memory_count();
/// The peak starts again from what is alive now.
void reset_cpu_memory_peak();

}  // namespace fastlearn
