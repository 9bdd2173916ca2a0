#include <fastlearn/core/detail/parallel.h>

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
  void (*set_num_threads)(int) = nullptr;
  // MKL's per-thread count, by value (mkl.h maps mkl_set_num_threads_local to it; the lower-case symbol is the Fortran
  // one, by reference); absent from a LibTorch without MKL.
  int (*mkl_set_local)(int) = nullptr;

  bool found() const { return parallel != nullptr && thread_num != nullptr && num_threads != nullptr; }
};

// LibTorch's libgomp is loaded already (libtorch_cpu needs it): take the symbols from that library by its
// soname, so that another OpenMP runtime earlier in the global lookup order cannot answer instead.
const OpenMpRuntime& openmp() {
  static const OpenMpRuntime runtime = [] {
    OpenMpRuntime r;
#if AT_PARALLEL_OPENMP
    void* library = dlopen("libgomp.so.1", RTLD_LAZY | RTLD_NOLOAD);
    void* from = library != nullptr ? library : RTLD_DEFAULT;
    r.parallel = reinterpret_cast<decltype(r.parallel)>(dlsym(from, "GOMP_parallel"));
    r.thread_num = reinterpret_cast<decltype(r.thread_num)>(dlsym(from, "omp_get_thread_num"));
    r.num_threads = reinterpret_cast<decltype(r.num_threads)>(dlsym(from, "omp_get_num_threads"));
    r.set_num_threads = reinterpret_cast<decltype(r.set_num_threads)>(dlsym(from, "omp_set_num_threads"));
#endif
    r.mkl_set_local = reinterpret_cast<decltype(r.mkl_set_local)>(dlsym(RTLD_DEFAULT, "MKL_Set_Num_Threads_Local"));
    return r;
  }();
  return runtime;
}

struct Job {
  const std::function<void(std::int64_t, std::int64_t)>* body;
  std::int64_t begin, end, grain;
  std::atomic_flag failed = ATOMIC_FLAG_INIT;
  std::exception_ptr error;
};

// One thread's share of a Job. The team is always the default size (a team whose size changes from call to call
// makes libgomp let its threads go and start new ones), and the threads beyond the ranges the grain allows
// have nothing to do.
void run_share(void* data) {
  auto& job = *static_cast<Job*>(data);
  const auto size = job.end - job.begin;
  const std::int64_t shares = std::min<std::int64_t>(openmp().num_threads(), (size + job.grain - 1) / job.grain);
  const std::int64_t share = openmp().thread_num();
  if (share >= shares) return;
  const auto first = job.begin + size * share / shares, last = job.begin + size * (share + 1) / shares;
  try {
    const at::internal::ThreadIdGuard thread_id(static_cast<int>(share));
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
  grain = std::max<std::int64_t>(grain, 1);
  const bool parallel = end - begin > grain && at::get_num_threads() > 1 && !at::in_parallel_region();
  if (parallel && openmp().found()) {
    Job job{.body = &body, .begin = begin, .end = end, .grain = grain};
    openmp().parallel(&run_share, &job, 0, 0);  // 0: the team of at::get_num_threads() threads
    if (job.error) std::rethrow_exception(job.error);
    return;
  }
#if !AT_PARALLEL_OPENMP
  if (parallel) return at::parallel_for(begin, end, grain, body);
#endif
  const at::internal::ThreadIdGuard thread_id(0);
  const c10::ParallelGuard in_parallel(true);
  body(begin, end);
}

int team_size() { return at::get_num_threads(); }

void set_team_size(int threads) {
  // LibTorch sets a thread's count at its first parallel call (lazy_init_num_threads, whose flag is LibTorch's own:
  // the inline copy in our files has another). at::get_num_threads, compiled in LibTorch, does that now, so that it
  // cannot later set its count over ours.
  at::get_num_threads();
  if (openmp().set_num_threads == nullptr) return at::set_num_threads(threads);
  openmp().set_num_threads(threads);
  if (openmp().mkl_set_local != nullptr) openmp().mkl_set_local(threads);
}

void compute_alone() { set_team_size(1); }

}  // namespace fastlearn
