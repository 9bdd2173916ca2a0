#pragma once
// The c10d backend of ranks that are threads of this one process (BackendKind::threads): the replicas of a
// model that ParallelTrainer drives side by side on the CPU, or on one GPU. Tensors are exchanged in place, with
// no copy into a transport: a call registers its tensors and returns; the rank that arrives last at a call runs
// it for everyone (a sum in rank order, so the result does not depend on who arrived last) and completes every
// rank's Work. Nobody blocks before wait(), so a rank may launch several calls ahead (the gradient reducer's
// buckets) and ranks that share one autograd device thread cannot deadlock on each other there.
//
// On a GPU the last rank's kernels go to its current stream: every rank's work on that device must be ordered
// by one stream (the default stream, as the replicas use), so that a call's kernels follow every rank's inputs.
// Calls: all_reduce (sum, avg, product, min, max), broadcast, all_gather, barrier, and the flat reduce_scatter and
// all_gather_into (_reduce_scatter_base, _allgather_base), one tensor per rank and call; anything else is a
// DistributedError. Calls that do not match across ranks fail on every rank, naming each
// rank's call.
#include <c10/util/intrusive_ptr.h>

#include <chrono>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace c10d {
class Backend;
}

namespace fastlearn {

/// getBackendName() of these backends.
inline constexpr std::string_view threads_backend_name = "threads";

/// The backends of `size` ranks meeting in this process: element r is rank r's, to be used by one thread.
std::vector<c10::intrusive_ptr<c10d::Backend>> threads_backends(int size);

/// Fails every call of `backend`'s ranks now waiting or made later with `reason` (a rank's thread failed, so
/// its peers must not wait for it); the backends stay failed. `backend` must come from threads_backends.
void abort_threads_backend(c10d::Backend& backend, const std::string& reason);

}  // namespace fastlearn
