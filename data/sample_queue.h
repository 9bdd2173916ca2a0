#pragma once
// A bounded, thread-safe queue of samples between a program that produces them while it runs (a simulation, a
// solver, a robot) and the thread that trains on them (Learner::train_step), so that the two overlap. The producer
// pushes items (or the rows of a batch); the trainer pops batches of them. When the queue is full, the policy
// decides: the producer waits (nothing is lost), or the oldest or the newest sample is dropped and counted. Every
// sample popped was pushed once and is popped once, in the order pushed.
#include <fastlearn/data/batch.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <optional>

namespace fastlearn {

enum class QueueFull {
  block,        ///< push waits until the trainer pops (nothing is dropped)
  drop_oldest,  ///< the oldest queued sample makes room (the freshest data trains)
  drop_newest,  ///< the sample pushed is dropped (what is queued trains)
};

struct SampleQueueOptions {
  std::int64_t capacity = 4096;  ///< samples held at most; > 0
  QueueFull when_full = QueueFull::block;
};

struct SampleQueueCounts {
  std::int64_t pushed = 0;   ///< samples given to push (dropped ones included)
  std::int64_t popped = 0;   ///< samples handed out in batches
  std::int64_t dropped = 0;  ///< samples a full queue dropped (the drop policies)
  std::int64_t queued = 0;   ///< samples waiting now
};

class SampleQueue {
 public:
  explicit SampleQueue(SampleQueueOptions options = {});

  /// Adds one sample (tensors without a batch dimension). With QueueFull::block, waits while the queue is full.
  /// Error after close(); DataError when its tensors' count or shapes differ from the first sample's.
  void push(Item sample);
  /// Adds each row of `batch` as a sample, in order.
  void push_rows(const Batch& batch);

  /// The next `n` samples as one batch (stacked), waiting until there are `n`; fewer once the queue is closed and
  /// runs out, and nullopt when it is closed and empty. With a timeout, nullopt also when it passes first (the
  /// samples stay queued).
  std::optional<Batch> pop_batch(std::int64_t n);
  std::optional<Batch> pop_batch(std::int64_t n, std::chrono::milliseconds timeout);

  /// No more samples: waiting pushes fail, pops drain what is queued and then get nullopt.
  void close();
  bool closed() const;

  SampleQueueCounts counts() const;

 private:
  std::optional<Batch> pop_locked(std::unique_lock<std::mutex>& lock, std::int64_t n);
  void check_shape(const Item& sample);

  const SampleQueueOptions options_;
  mutable std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<Item> samples_;
  std::optional<Item> first_;  // the first sample's tensors: every later one must match their count and shapes
  SampleQueueCounts counts_;
  bool closed_ = false;
};

}  // namespace fastlearn
