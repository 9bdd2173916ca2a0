#pragma once
// ReplicaThreads: one persistent thread per replica of a model trained side by side in one process
// (ParallelTrainer). run() hands every thread the same job, each with its index, and returns when all are done;
// the caller's thread-local state (grad mode, autocast) holds in the threads for the job.
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace fastlearn {

class ReplicaThreads {
 public:
  /// Starts `n` threads; `start(i)` runs first in thread i (and the constructor waits for every one: a throw there
  /// is rethrown here, naming the thread).
  ReplicaThreads(int n, const std::function<void(int)>& start);
  ~ReplicaThreads();
  ReplicaThreads(const ReplicaThreads&) = delete;
  ReplicaThreads& operator=(const ReplicaThreads&) = delete;

  int size() const { return static_cast<int>(threads_.size()); }

  /// Runs job(i) on thread i for every i, at the same time, and waits for all of them. When some throw,
  /// `failed(i, message)` runs at once in the first thread that did (to release the others from any wait on it), and
  /// once all are done run() throws the error again, of its kind (a DataError stays one), naming that thread's index.
  void run(const std::function<void(int)>& job, const std::function<void(int, const std::string&)>& failed = {});

 private:
  void main(int index, const std::function<void(int)>& start);
  void stop();

  std::vector<std::thread> threads_;
  std::mutex mutex_;
  std::condition_variable wake_, done_;
  std::int64_t generation_ = 0;  // jobs handed out so far
  int busy_ = 0;                 // threads still on the current job (or starting)
  bool stopping_ = false;
  const std::function<void(int)>* job_ = nullptr;
  const std::function<void(int, const std::string&)>* failed_ = nullptr;
  int first_failure_ = -1;
  std::string failure_;
  std::exception_ptr error_;
  const void* state_ = nullptr;  // the caller's at::ThreadLocalState for the current job
};

}  // namespace fastlearn
