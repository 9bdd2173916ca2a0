#include <fastlearn/distributed/detail/replica_threads.h>

#include <fastlearn/core/detail/error_context.h>
#include <fastlearn/core/error.h>

#include <ATen/ThreadLocalState.h>
#include <fmt/format.h>

namespace fastlearn {

ReplicaThreads::ReplicaThreads(int n, const std::function<void(int)>& start) {
  if (n < 1) throw Error(fmt::format("ReplicaThreads: {} threads; need at least 1", n));
  busy_ = n;
  try {
    for (int i = 0; i < n; ++i) threads_.emplace_back([this, i, &start] { main(i, start); });
  } catch (...) {  // no thread for the rest: end those that started, then say why
    {
      std::lock_guard lock(mutex_);
      busy_ = 0;
    }
    stop();
    throw;
  }
  std::unique_lock lock(mutex_);
  done_.wait(lock, [this] { return busy_ == 0; });
  if (first_failure_ >= 0) {
    const auto error = error_;
    const auto context = fmt::format("replica thread {} could not start", first_failure_);
    lock.unlock();
    stop();
    rethrow_with_context(error, context);
  }
}

ReplicaThreads::~ReplicaThreads() { stop(); }

void ReplicaThreads::stop() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  for (auto& t : threads_)
    if (t.joinable()) t.join();
}

void ReplicaThreads::main(int index, const std::function<void(int)>& start) {
  auto report = [&](std::exception_ptr error) {
    std::lock_guard lock(mutex_);
    if (first_failure_ < 0) {
      first_failure_ = index;
      failure_ = message_of(error);
      error_ = error;
      if (failed_ && *failed_) {
        try {
          (*failed_)(index, failure_);
        } catch (...) {  // releasing the others is best effort; the failure itself is what run() reports
        }
      }
    }
  };
  try {
    start(index);
  } catch (...) {
    report(std::current_exception());
  }
  std::int64_t seen = 0;
  {
    std::lock_guard lock(mutex_);
    if (--busy_ == 0) done_.notify_all();
  }
  while (true) {
    const std::function<void(int)>* job = nullptr;
    const at::ThreadLocalState* state = nullptr;
    {
      std::unique_lock lock(mutex_);
      wake_.wait(lock, [&] { return stopping_ || generation_ != seen; });
      if (stopping_) return;
      seen = generation_;
      job = job_;
      state = static_cast<const at::ThreadLocalState*>(state_);
    }
    try {
      const at::ThreadLocalStateGuard guard(*state);
      (*job)(index);
    } catch (...) {
      report(std::current_exception());
    }
    std::lock_guard lock(mutex_);
    if (--busy_ == 0) done_.notify_all();
  }
}

void ReplicaThreads::run(const std::function<void(int)>& job,
                         const std::function<void(int, const std::string&)>& failed) {
  const at::ThreadLocalState state;
  {
    std::lock_guard lock(mutex_);
    job_ = &job;
    failed_ = &failed;
    state_ = &state;
    first_failure_ = -1;
    failure_.clear();
    error_ = nullptr;
    busy_ = size();
    ++generation_;
  }
  wake_.notify_all();
  std::unique_lock lock(mutex_);
  done_.wait(lock, [this] { return busy_ == 0; });
  job_ = nullptr;
  failed_ = nullptr;
  state_ = nullptr;
  if (first_failure_ >= 0) rethrow_with_context(error_, fmt::format("replica {}", first_failure_));
}

}  // namespace fastlearn
