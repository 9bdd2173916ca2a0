#include <fastlearn/data/sample_queue.h>

#include <fastlearn/core/error.h>
#include <fastlearn/data/dataset.h>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/torch.h>

namespace fastlearn {

namespace {

bool same_shapes(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (a[i].sizes() != b[i].sizes() || a[i].scalar_type() != b[i].scalar_type()) return false;
  return true;
}

// "[3, 4] float, [1] long": each tensor's shape and type.
std::string shapes(const std::vector<at::Tensor>& tensors) {
  std::vector<std::string> parts;
  for (const auto& t : tensors)
    parts.push_back(fmt::format("[{}] {}", fmt::join(t.sizes(), ", "), c10::toString(t.scalar_type())));
  return parts.empty() ? std::string("none") : fmt::format("{}", fmt::join(parts, ", "));
}

}  // namespace

SampleQueue::SampleQueue(SampleQueueOptions options) : options_(options) {
  if (options_.capacity < 1)
    throw ConfigError(fmt::format("SampleQueue: capacity must be positive, got {}", options_.capacity));
}

void SampleQueue::check_shape(const Item& sample) {
  if (sample.inputs.empty()) throw DataError("SampleQueue::push: a sample needs at least one input tensor");
  if (!first_) {
    first_ = sample;
    return;
  }
  if (!same_shapes(sample.inputs, first_->inputs) || !same_shapes(sample.targets, first_->targets))
    throw DataError(fmt::format(
        "SampleQueue::push: sample {} has inputs {} and targets {}; the first had inputs {} and targets {} (the "
        "samples of a batch have the same tensors)",
        counts_.pushed, shapes(sample.inputs), shapes(sample.targets), shapes(first_->inputs),
        shapes(first_->targets)));
}

void SampleQueue::push(Item sample) {
  std::unique_lock lock(mutex_);
  if (closed_) throw Error("SampleQueue::push: the queue is closed");
  check_shape(sample);
  ++counts_.pushed;
  if (static_cast<std::int64_t>(samples_.size()) >= options_.capacity) {
    switch (options_.when_full) {
      case QueueFull::block:
        changed_.wait(lock, [&] { return closed_ || static_cast<std::int64_t>(samples_.size()) < options_.capacity; });
        if (closed_) throw Error("SampleQueue::push: the queue was closed while this push waited");
        break;
      case QueueFull::drop_oldest:
        samples_.pop_front();
        ++counts_.dropped;
        break;
      case QueueFull::drop_newest:
        ++counts_.dropped;
        return;
    }
  }
  samples_.push_back(std::move(sample));
  lock.unlock();
  changed_.notify_all();
}

void SampleQueue::push_rows(const Batch& batch) {
  for (std::int64_t i = 0; i < batch.size(); ++i) {
    Item row;
    for (const auto& t : batch.inputs) row.inputs.push_back(t[i]);
    for (const auto& t : batch.targets) row.targets.push_back(t[i]);
    push(std::move(row));
  }
}

std::optional<Batch> SampleQueue::pop_locked(std::unique_lock<std::mutex>& lock, std::int64_t n) {
  const auto take = std::min<std::int64_t>(n, static_cast<std::int64_t>(samples_.size()));
  if (take == 0) return std::nullopt;
  std::vector<Item> items(std::make_move_iterator(samples_.begin()), std::make_move_iterator(samples_.begin() + take));
  samples_.erase(samples_.begin(), samples_.begin() + take);
  counts_.popped += take;
  lock.unlock();
  changed_.notify_all();
  return collate(items);  // stacked outside the lock: the producer goes on meanwhile
}

std::optional<Batch> SampleQueue::pop_batch(std::int64_t n) {
  if (n < 1) throw ConfigError(fmt::format("SampleQueue::pop_batch: n must be positive, got {}", n));
  std::unique_lock lock(mutex_);
  changed_.wait(lock, [&] { return closed_ || static_cast<std::int64_t>(samples_.size()) >= n; });
  return pop_locked(lock, n);
}

std::optional<Batch> SampleQueue::pop_batch(std::int64_t n, std::chrono::milliseconds timeout) {
  if (n < 1) throw ConfigError(fmt::format("SampleQueue::pop_batch: n must be positive, got {}", n));
  std::unique_lock lock(mutex_);
  if (!changed_.wait_for(lock, timeout, [&] { return closed_ || static_cast<std::int64_t>(samples_.size()) >= n; }))
    return std::nullopt;
  return pop_locked(lock, n);
}

void SampleQueue::close() {
  {
    std::lock_guard lock(mutex_);
    closed_ = true;
  }
  changed_.notify_all();
}

bool SampleQueue::closed() const {
  std::lock_guard lock(mutex_);
  return closed_;
}

SampleQueueCounts SampleQueue::counts() const {
  std::lock_guard lock(mutex_);
  auto c = counts_;
  c.queued = static_cast<std::int64_t>(samples_.size());
  return c;
}

}  // namespace fastlearn
