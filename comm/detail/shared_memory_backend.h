#pragma once
// A c10d backend for the ranks of one host. all_reduce, broadcast, barrier, and the flat reduce_scatter and
// all_gather_into of sharded training, of dense contiguous CPU tensors go through a shared memory segment: each rank
// copies its tensor into its own slot, waits until every rank has arrived, and reads the result straight from the
// peers' slots. That is one memcpy and one wake-up instead of Gloo's loopback TCP round trips, which cost about a
// millisecond each on a busy 2-core machine (SyncBatchNorm makes two per layer per step). Every other operation, and
// tensors it does not handle (CUDA, sparse, several per call, unusual dtypes or ops), go to the wrapped Gloo backend.
//
// Waits spin for a few microseconds, then sleep on a futex. A wait fails with a DistributedError naming the
// rank it waited for when that rank exits (its pid is gone), gives up (it failed or was aborted), or does
// not arrive within the group's timeout.
#include <c10/util/intrusive_ptr.h>

#include <chrono>
#include <string_view>

namespace c10d {
class Backend;
class Store;
}  // namespace c10d

namespace fastlearn {

/// getBackendName() of the wrapping backend.
inline constexpr std::string_view shared_memory_backend_name = "gloo+shm";

/// Wraps `gloo` (rank `rank` of `world_size`, every rank on this host) with a shared memory segment met
/// through `store` (a store prefixed for this group). Every rank must call it. When some rank cannot map the
/// segment (for example /dev/shm is too small), every rank gets `gloo` back unchanged, and that rank says why
/// on stderr.
c10::intrusive_ptr<c10d::Backend> with_shared_memory(c10::intrusive_ptr<c10d::Backend> gloo, c10d::Store& store,
                                                     int rank, int world_size, std::chrono::milliseconds timeout);

}  // namespace fastlearn
