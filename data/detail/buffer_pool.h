#pragma once
// Reused memory for the large tensors a DataLoader makes per batch (collated images, their float copies).
// A fresh allocation of tens of megabytes costs more than the arithmetic that fills it: the kernel maps
// and zeroes every page again, which for an image batch takes longer than the work (bench/README.md). A pool
// hands out tensors whose memory it keeps; a buffer is reused once nobody but the pool holds
// it, so batches a user keeps stay valid. The DataLoader installs its pool on the threads that make
// batches; code there asks for memory through pooled_empty, which falls back to at::empty elsewhere.
#include <ATen/core/Tensor.h>
#include <c10/util/ArrayRef.h>

#include <cstddef>
#include <mutex>
#include <vector>

namespace fastlearn {

class BufferPool {
 public:
  /// Keeps at most `max_buffers` buffers; past that, requests get plain allocations.
  explicit BufferPool(std::size_t max_buffers) : max_buffers_(max_buffers) {}

  /// An uninitialized CPU tensor of `sizes` and `dtype`, contiguous.
  at::Tensor empty(c10::IntArrayRef sizes, c10::ScalarType dtype);

 private:
  std::mutex mutex_;
  std::vector<at::Tensor> buffers_;  // flat uint8 tensors; free when only the pool holds their storage
  std::size_t max_buffers_;
};

/// Makes `pool` the one pooled_empty uses on this thread, for the guard's lifetime.
class UseBufferPool {
 public:
  explicit UseBufferPool(BufferPool& pool);
  ~UseBufferPool();
  UseBufferPool(const UseBufferPool&) = delete;
  UseBufferPool& operator=(const UseBufferPool&) = delete;

 private:
  BufferPool* previous_;
};

/// Makes `pool` (or none) the thread's pool and returns the one before: for code that switches between two lines of
/// work on one thread (the step API's fit and the program driving it).
BufferPool* exchange_buffer_pool(BufferPool* pool);

/// An uninitialized contiguous tensor like at::empty(sizes, options): from this thread's pool when one is
/// installed and the device is the CPU.
at::Tensor pooled_empty(c10::IntArrayRef sizes, const at::TensorOptions& options);

}  // namespace fastlearn
