#include <fastlearn/core/cpu_memory_counter.h>

#include <fastlearn/core/cpu_memory_cache.h>

#include <c10/core/CPUAllocator.h>

#include <atomic>
#include <cstring>

namespace fastlearn {
namespace {

class CountingAllocator final : public c10::Allocator {
 public:
  explicit CountingAllocator(c10::Allocator* inner) : inner_(inner) {}

  c10::DataPtr allocate(std::size_t n) override {
    auto held = inner_->allocate(n);
    void* data = held.get();
    const auto device = held.device();
    add(n);
    auto* record = new Record{std::move(held), n, this};
    return {data, record, &release, device};
  }

  // A counted block's data is not its context: c10's raw_allocate cannot free it, so it is not offered.
  c10::DeleterFnPtr raw_deleter() const override { return nullptr; }

  void copy_data(void* dest, const void* src, std::size_t count) const override { std::memcpy(dest, src, count); }

  CpuMemoryCount count() const { return {current_.load(), peak_.load()}; }
  void reset_peak() { peak_.store(current_.load()); }

 private:
  struct Record {
    c10::DataPtr held;  // the inner allocator's block, freed with the record
    std::size_t bytes;
    CountingAllocator* owner;
  };

  static void release(void* context) {
    auto* record = static_cast<Record*>(context);
    record->owner->current_.fetch_sub(record->bytes);
    delete record;
  }

  void add(std::size_t n) {
    const auto now = current_.fetch_add(n) + n;
    auto peak = peak_.load();
    while (now > peak && !peak_.compare_exchange_weak(peak, now)) {}
  }

  c10::Allocator* inner_;
  std::atomic<std::size_t> current_{0};
  std::atomic<std::size_t> peak_{0};
};

std::atomic<CountingAllocator*> counter{nullptr};

}  // namespace

void count_cpu_memory() {
  static const bool started = [] {
    enable_cpu_memory_cache();  // first, so that the Learner's call later leaves the counter in place
    // Never destroyed: counted tensors may be freed during static destruction.
    auto* counting = new CountingAllocator(c10::GetCPUAllocator());
    c10::SetCPUAllocator(counting, /*priority=*/2);  // above the cache's 1
    counter.store(counting);
    return true;
  }();
  (void)started;
}

bool counting_cpu_memory() { return counter.load() != nullptr; }

CpuMemoryCount cpu_memory_count() {
  const auto* counting = counter.load();
  return counting ? counting->count() : CpuMemoryCount{};
}

void reset_cpu_memory_peak() {
  if (auto* counting = counter.load()) counting->reset_peak();
}

}  // namespace fastlearn
