#pragma once
// Work over many files (decoding every image or mask once) on threads of their own.
#include <cstddef>
#include <functional>

namespace fastlearn {

/// Calls body(i) for i in [0, n) on `threads` threads (0: all cores), each index once; the calling thread is one of
/// them. The others compute alone (compute_alone): one thread per core already, so an OpenMP team each would
/// oversubscribe the cores.
void for_each_file(std::size_t n, int threads, const std::function<void(std::size_t)>& body);

}  // namespace fastlearn
