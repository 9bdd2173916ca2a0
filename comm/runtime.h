#pragma once
// The distributed runtime of this process: setup_distrib() resolves where the process sits in the job
// (comm/env.h), meets the other ranks (comm/detail/rendezvous.h) and creates the world process
// group; teardown_distrib() undoes it. rank(), world_size(), ... answer from the environment before setup
// too, so a program asks the same questions on one process or many.
#include <fastlearn/comm/env.h>
#include <fastlearn/comm/group.h>
#include <fastlearn/comm/process_group.h>

#include <c10/core/Device.h>

#include <chrono>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace c10d {
class Store;
}

namespace fastlearn {

struct SetupOptions {
  std::string init_method = "env://";  ///< env://, tcp://HOST:PORT or file:///PATH
  /// Default ("auto"): FASTLEARN_BACKEND (gloo or nccl) if set, else NCCL when every rank of the job has a GPU of its
  /// own (each binds its local rank's), else Gloo with a line on stderr saying why (auto_backend).
  std::optional<BackendKind> backend;
  std::chrono::milliseconds timeout = std::chrono::minutes(30);  ///< rendezvous and every collective
  EnvOptions env;                                                ///< overrides of the environment
  std::optional<bool> debug;  ///< check every collective's op, shape and dtype across ranks; default:
                              ///< FASTLEARN_DISTRIBUTED_DEBUG=1 or TORCH_DISTRIBUTED_DEBUG=DETAIL
  int gloo_threads = 2;
  /// Gloo with every rank on this host (LOCAL_WORLD_SIZE == WORLD_SIZE): CPU all_reduce, broadcast and
  /// barrier go through shared memory instead of loopback TCP. Default: on, unless FASTLEARN_SHARED_MEMORY=0.
  std::optional<bool> shared_memory;
  /// While ranks are missing at the rendezvous, each waiting rank says on stderr how many have joined, first after
  /// this long, then at twice the previous interval (up to 5 minutes); 0: never.
  std::chrono::milliseconds waiting_notice_after = std::chrono::seconds(10);
};

/// Sets up the world process group; DistributedError when it is already set up, the environment is
/// inconsistent, or the rendezvous fails.
void setup_distrib(const SetupOptions& options = {});
/// Destroys every process group and the store; nothing happens when nothing is set up. NCCL
/// communicators are shut down cleanly (every rank should call it).
void teardown_distrib();
/// Like teardown_distrib, after a failure: NCCL communicators are aborted, so that no kernel of this rank
/// keeps waiting for a peer that died or hangs. DistribCtx calls it when its scope ends by an exception.
void abort_distrib();
bool is_initialized();

/// This process's rank in the job (from the environment before setup; 0 for a single process).
int rank();
int world_size();
int local_rank();
int local_world_size();
/// rank() == 0
bool is_main();
/// The resolved layout of the job (set up or not).
DistEnv dist_env();

/// The world group; DistributedError when nothing is set up.
Group& world_group();
/// The job's store; DistributedError when nothing is set up.
c10d::Store& dist_store();
/// A new group of the given global ranks. Every rank of the job must call it, in the same order
/// (members and non-members alike), as with torch.distributed.new_group.
GroupPtr new_group(std::vector<int> ranks, std::optional<BackendKind> backend = {});
/// Whether collectives check op, shape and dtype across ranks before running.
bool debug_checks_enabled();
/// The device this rank computes on: cuda:<local rank> with NCCL, CPU otherwise.
c10::Device distrib_device();
/// The device of the tensors `group`'s collectives take: cuda:<local rank> for NCCL (also a group of a Gloo
/// world), CPU for Gloo.
c10::Device device_of(const Group& group);
/// What backend "auto" picks for `local_ranks` ranks on a host with `gpus` visible GPUs: NCCL when each rank can have
/// a GPU of its own, else Gloo (the ranks then train on the CPU). setup_distrib takes NCCL only when this says NCCL
/// on every host of the job.
BackendKind auto_backend(int local_ranks, int gpus);

namespace detail {
/// For DistribCtx: takes ownership of a setup made implicitly by rank0_first (true if there was one).
bool adopt_implicit_setup();
bool rank0_first_needs_sync();
void rank0_first_done(bool ok, const std::string& error);
void rank0_first_wait();
}  // namespace detail

/// Runs `fn` on rank 0 first, then on the other ranks once rank 0 finished (e.g. a download the others
/// then find in the cache); returns fn's result. With one process it is just fn(). With several and no
/// process group yet, it sets one up from the environment (a DistribCtx later adopts it). If fn throws
/// on rank 0, the other ranks throw a DistributedError carrying rank 0's message instead of running fn.
template <typename Fn>
auto rank0_first(Fn&& fn) -> decltype(fn()) {
  if (!detail::rank0_first_needs_sync()) return fn();
  if (rank() != 0) {
    detail::rank0_first_wait();
    return fn();
  }
  try {
    if constexpr (std::is_void_v<decltype(fn())>) {
      fn();
      detail::rank0_first_done(true, "");
    } else {
      auto result = fn();
      detail::rank0_first_done(true, "");
      return result;
    }
  } catch (const std::exception& e) {
    detail::rank0_first_done(false, e.what());
    throw;
  }
}

}  // namespace fastlearn
