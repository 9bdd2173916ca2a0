#pragma once
// Creates c10d communication backends (Gloo for CPU tensors, NCCL for CUDA tensors) over a store.
#include <c10/util/intrusive_ptr.h>

#include <chrono>
#include <exception>
#include <string>
#include <string_view>

namespace c10d {
class Backend;
class Store;
}  // namespace c10d

namespace fastlearn {

/// gloo and nccl connect processes; threads connects the threads of one process (ParallelTrainer's replicas,
/// comm/detail/threads_backend.h) and is never chosen by a launch or a config.
enum class BackendKind { gloo, nccl, threads };

std::string_view to_string(BackendKind kind);

/// Parses "gloo" or "nccl" (the kinds a job may choose); anything else is a ConfigError that lists the choices.
BackendKind parse_backend_kind(std::string_view name);

/// Whether this build of fastlearn can create the backend (NCCL needs LibTorch with CUDA).
bool backend_compiled_in(BackendKind kind);

struct BackendOptions {
  std::chrono::milliseconds timeout = std::chrono::minutes(30);  ///< per collective
  std::string hostname = "127.0.0.1";                            ///< Gloo: address this rank's transport binds to
  int gloo_threads = 2;                                          ///< Gloo: worker threads of the backend
  /// Gloo, every rank of the group on this host: all_reduce, broadcast and barrier of CPU tensors go through
  /// shared memory (comm/detail/shared_memory_backend.h).
  bool shared_memory = false;
  /// NCCL: the GPU this rank uses (torch's device_id): the communicator is bound to it and created at
  /// once, so a bad setup fails here and not in the first collective. Default: the current CUDA device.
  int cuda_device = -1;
};

/// Connects rank `rank` of `world_size` through `store` and returns the backend, ready for collectives.
/// Throws DistributedError (what, which rank, what to do) on bad arguments or a failed rendezvous.
c10::intrusive_ptr<c10d::Backend> make_backend(BackendKind kind, const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                               int world_size, const BackendOptions& options = {});

/// The message of an exception, without the C++ backtrace LibTorch's errors carry (for our own messages).
std::string error_text(const std::exception& e);

/// Ends `backend`: shutdown() after a normal run; abort() after a failure, so that an NCCL rank whose
/// peer died does not stay blocked in a CUDA kernel (Gloo needs neither; its threads end with it).
void close_backend(c10d::Backend& backend, bool abort);

}  // namespace fastlearn
