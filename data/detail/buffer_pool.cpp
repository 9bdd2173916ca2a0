#include <fastlearn/data/detail/buffer_pool.h>

#include <torch/torch.h>

#include <utility>

namespace fastlearn {
namespace {

thread_local BufferPool* current_pool = nullptr;

// Below this a fresh allocation is cheap (malloc reuses freed memory without returning it to the kernel).
constexpr std::int64_t kPooledFrom = std::int64_t{1} << 20;

}  // namespace

at::Tensor BufferPool::empty(c10::IntArrayRef sizes, c10::ScalarType dtype) {
  const auto options = at::TensorOptions().dtype(dtype);
  const auto nbytes = c10::multiply_integers(sizes) * static_cast<std::int64_t>(c10::elementSize(dtype));
  std::lock_guard lock(mutex_);
  at::Tensor* best = nullptr;  // the smallest free buffer that fits
  for (auto& buffer : buffers_) {
    // use_count 1: only this pool holds the storage, and only the pool can hand it out again.
    if (buffer.storage().use_count() == 1 && buffer.numel() >= nbytes && (!best || buffer.numel() < best->numel()))
      best = &buffer;
  }
  if (!best) {
    if (buffers_.size() >= max_buffers_) return at::empty(sizes, options);
    buffers_.push_back(at::empty({nbytes}, at::kByte));
    best = &buffers_.back();
  }
  return at::empty({0}, options).set_(best->storage(), 0, sizes);
}

UseBufferPool::UseBufferPool(BufferPool& pool) : previous_(current_pool) { current_pool = &pool; }

UseBufferPool::~UseBufferPool() { current_pool = previous_; }

BufferPool* exchange_buffer_pool(BufferPool* pool) { return std::exchange(current_pool, pool); }

at::Tensor pooled_empty(c10::IntArrayRef sizes, const at::TensorOptions& options) {
  const bool poolable = current_pool && options.device().is_cpu() && !options.pinned_memory() &&
                        c10::multiply_integers(sizes) * options.dtype().itemsize() >= kPooledFrom;
  if (!poolable) return at::empty(sizes, options);
  return current_pool->empty(sizes, options.dtype().toScalarType());
}

}  // namespace fastlearn
