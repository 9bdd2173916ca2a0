#include <fastlearn/core/parallel.h>

#include <ATen/Config.h>
#include <ATen/Parallel.h>
#include <c10/util/ParallelGuard.h>

#include <dlfcn.h>

#include <algorithm>
#include <atomic>
#include <exception>

namespace fastlearn {

namespace {

// The entry points of the OpenMP runtime LibTorch was built with, found among the libraries already loaded
// (libtorch_cpu needs libgomp): GOMP_parallel is what GCC compiles `#pragma omp parallel` to.
struct OpenMpRuntime {
  void (*parallel)(void (*)(void*), void*, unsigned, unsigned) = nullptr;
  int (*thread_num)() = nullptr;
  int (*num_threads)() = nullptr;

  bool found() const { return parallel != nullptr && thread_num != nullptr && num_threads != nullptr; }
};

const OpenMpRuntime& openmp() {
  static const OpenMpRuntime runtime = [] {
    OpenMpRuntime r;
#if AT_PARALLEL_OPENMP
    r.parallel = reinterpret_cast<decltype(r.parallel)>(dlsym(RTLD_DEFAULT, "GOMP_parallel"));
    r.thread_num = reinterpret_cast<decltype(r.thread_num)>(dlsym(RTLD_DEFAULT, "omp_get_thread_num"));
    r.num_threads = reinterpret_cast<decltype(r.num_threads)>(dlsym(RTLD_DEFAULT, "omp_get_num_threads"));
#endif
    return r;
  }();
  return runtime;
}

struct Job {
  const std::function<void(std::int64_t, std::int64_t)>* body;
  std::int64_t begin, end;
  std::atomic_flag failed = ATOMIC_FLAG_INIT;
  std::exception_ptr error;
};

// One thread's share of a Job: the team splits the range evenly by thread number.
void run_share(void* data) {
  auto& job = *static_cast<Job*>(data);
  const std::int64_t thread = openmp().thread_num(), threads = openmp().num_threads();
  const auto size = job.end - job.begin;
  const auto first = job.begin + size * thread / threads, last = job.begin + size * (thread + 1) / threads;
  if (first >= last) return;
  try {
    const at::internal::ThreadIdGuard thread_id(static_cast<int>(thread));
    const c10::ParallelGuard in_parallel(true);
    (*job.body)(first, last);
  } catch (...) {
    if (!job.failed.test_and_set()) job.error = std::current_exception();
  }
}

}  // namespace

void parallel_for(std::int64_t begin, std::int64_t end, std::int64_t grain,
                  const std::function<void(std::int64_t, std::int64_t)>& body) {
  if (begin >= end) return;
  at::internal::lazy_init_num_threads();
  const auto size = end - begin;
  grain = std::max<std::int64_t>(grain, 1);
  const auto threads = std::min<std::int64_t>(at::get_num_threads(), (size + grain - 1) / grain);
  if (threads <= 1 || at::in_parallel_region() || !openmp().found()) {
#if !AT_PARALLEL_OPENMP
    if (threads > 1 && !at::in_parallel_region()) return at::parallel_for(begin, end, grain, body);
#endif
    const c10::ParallelGuard in_parallel(true);
    return body(begin, end);
  }
  Job job{.body = &body, .begin = begin, .end = end};
  openmp().parallel(&run_share, &job, static_cast<unsigned>(threads), 0);
  if (job.error) std::rethrow_exception(job.error);
}

}  // namespace fastlearn
