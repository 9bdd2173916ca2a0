#pragma once
// How fastlearn waits for a collective, and the collectives nobody waits for on the host. NCCL work on CUDA
// tensors only makes the current CUDA stream wait for it (ProcessGroupNCCL's wait() without a timeout), so that
// the host goes on queueing the step while the GPU communicates: a wait with a timeout, as Gloo's need, would
// block the host until the GPU is done. Such work is remembered here with what it was, and checked without
// blocking at the group's next collective (and at the end of every backward): a failure or a timeout then becomes
// the same DistributedError, naming the operation, that a host wait would have thrown.
#include <c10/util/intrusive_ptr.h>

#include <chrono>
#include <cstdint>
#include <deque>
#include <mutex>
#include <optional>
#include <string>

namespace c10d {
class Work;
}

namespace fastlearn {

enum class BackendKind;

/// How a caller waits for a collective's work.
enum class WaitMode {
  host,    ///< block the host until the work is done, or the timeout passed (Gloo; every barrier)
  stream,  ///< make the current CUDA stream wait for it; the host goes on (NCCL)
};

/// The wait mode of a collective on a `kind` backend; `barrier`: the call exists to make the hosts meet.
WaitMode wait_mode(BackendKind kind, bool barrier = false);

/// Thread-safe.
class PendingWorks {
 public:
  using Clock = std::chrono::steady_clock;

  /// What went wrong with a pending operation.
  struct Failure {
    std::string what;    ///< the operation, as it was added
    std::int64_t call;   ///< its call number in the group (Group::next_call)
    std::string reason;  ///< the backend's error, or that it outlived the timeout
  };

  /// Remembers `work` (already made the stream's business), named `what`, started at `started`.
  void add(c10::intrusive_ptr<c10d::Work> work, std::string what, std::int64_t call,
           Clock::time_point started = Clock::now());
  /// The first failure, never blocking: with `backend_error` (e.g. NCCL's watchdog aborted the communicator, after
  /// which the aborted works look complete) the oldest operation still remembered, done or not, or the group as a
  /// whole when none is; else the first operation whose work holds an exception (or whose state cannot be read), or
  /// that is not complete and started more than `timeout` before `now`. The completed ones before it are forgotten.
  std::optional<Failure> check(std::chrono::milliseconds timeout, Clock::time_point now = Clock::now(),
                               const std::string& backend_error = {});
  /// Drops everything (the group is closing).
  void clear();
  std::size_t size() const;

 private:
  struct Entry {
    c10::intrusive_ptr<c10d::Work> work;
    std::string what;
    std::int64_t call = -1;
    Clock::time_point started;
  };
  mutable std::mutex mutex_;  // a backward's hooks (autograd's threads) and the training thread both add
  std::deque<Entry> entries_;
};

}  // namespace fastlearn
