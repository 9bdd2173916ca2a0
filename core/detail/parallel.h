#pragma once
// parallel_for for fastlearn's own loops, on the thread team LibTorch's kernels use. ATen's at::parallel_for is
// OpenMP inlined from its headers, and fastlearn is not compiled with OpenMP (clang's -fopenmp would bring its
// own runtime beside LibTorch's libgomp), so in our files it would run every range on the calling thread.
#include <cstdint>
#include <functional>

namespace fastlearn {

/// Calls body(first, last) on contiguous ranges that cover [begin, end), in parallel on LibTorch's OpenMP team,
/// as at::parallel_for runs inside LibTorch: at most one range per thread of at::get_num_threads() and at most
/// ceil((end - begin) / grain) ranges, of sizes that differ by at most one. It runs the whole range on the
/// calling thread when the range is at most `grain` items, when there is one thread, or when called inside a
/// parallel region. The first exception a range throws is rethrown once every range has ended.
void parallel_for(std::int64_t begin, std::int64_t end, std::int64_t grain,
                  const std::function<void(std::int64_t, std::int64_t)>& body);

/// The calling thread's OpenMP team size (at::get_num_threads(): OpenMP's thread count is per thread).
int team_size();

/// Sets the calling thread's team size alone. at::set_num_threads also changes the count every thread started later
/// takes, the oneDNN primitive cache and the pthreadpool: too much for a switch between two lines of work.
void set_team_size(int threads);

/// For a thread of fastlearn's that only prepares data (a loader worker): its ATen work runs on it alone, with no
/// OpenMP team (nor MKL's) of its own. A second team beside the training thread's would fight it for the cores, and
/// more OpenMP threads than cores make libgomp's teams stop spinning, so that every parallel region of the training
/// pays a wake-up (bench/README.md, loader_workers).
void compute_alone();

}  // namespace fastlearn
