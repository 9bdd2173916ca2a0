#include <fastlearn/comm/process_group.h>

#include <c10/util/Exception.h>
#include <fastlearn/comm/detail/shared_memory_backend.h>
#include <fastlearn/core/error.h>
#include <fmt/format.h>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#ifdef FASTLEARN_WITH_NCCL
#include <c10/cuda/CUDAFunctions.h>
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

#include <cstdlib>

namespace fastlearn {

std::string_view to_string(BackendKind kind) {
  switch (kind) {
    case BackendKind::gloo:
      return "gloo";
    case BackendKind::nccl:
      return "nccl";
    case BackendKind::threads:
      return "threads";
  }
  return "unknown";
}

BackendKind parse_backend_kind(std::string_view name) {
  if (name == "gloo") return BackendKind::gloo;
  if (name == "nccl") return BackendKind::nccl;
  throw ConfigError(fmt::format("unknown distributed backend '{}': expected 'gloo' or 'nccl'", name));
}

bool backend_compiled_in(BackendKind kind) {
  switch (kind) {
    case BackendKind::gloo:
#ifdef FASTLEARN_WITH_GLOO
      return true;
#else
      return false;
#endif
    case BackendKind::nccl:
#ifdef FASTLEARN_WITH_NCCL
      return true;
#else
      return false;
#endif
    case BackendKind::threads:
      return true;
  }
  return false;
}

namespace {

c10::intrusive_ptr<c10d::Backend> make_gloo(const c10::intrusive_ptr<c10d::Store>& store, int rank, int world_size,
                                            const BackendOptions& options) {
  auto gloo_options = c10d::ProcessGroupGloo::Options::create(options.timeout);
  gloo_options->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname(options.hostname));
  gloo_options->threads = options.gloo_threads;
  c10::intrusive_ptr<c10d::Backend> gloo =
      c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, world_size, gloo_options);
  if (!options.shared_memory || world_size == 1) return gloo;
  return with_shared_memory(std::move(gloo), *store, rank, world_size, options.timeout);
}

#ifdef FASTLEARN_WITH_NCCL
// What ProcessGroupNCCL reads when it is made, so that a failure or a timeout ends as fastlearn's DistributedError
// naming the operation and the silent ranks (collectives.h: check_pending) instead of ending the process: its
// watchdog aborts the communicator and leaves the process alive (error handling 2; torch's default, 3, ends the
// process from the watchdog's thread), without first dumping its flight recorder and waiting 4 x 15 s for the
// other ranks' dumps (after which its heartbeat monitor may end the process anyway). Values the user set stay.
void report_nccl_failures_as_errors() {
  if (!std::getenv("TORCH_NCCL_ASYNC_ERROR_HANDLING") && !std::getenv("NCCL_ASYNC_ERROR_HANDLING"))
    ::setenv("TORCH_NCCL_ASYNC_ERROR_HANDLING", "2", /*overwrite=*/0);
  ::setenv("TORCH_NCCL_DUMP_ON_TIMEOUT", "0", /*overwrite=*/0);
  ::setenv("TORCH_NCCL_WAIT_TIMEOUT_DUMP_MILSEC", "1000", /*overwrite=*/0);
}
#endif

c10::intrusive_ptr<c10d::Backend> make_nccl([[maybe_unused]] const c10::intrusive_ptr<c10d::Store>& store,
                                            [[maybe_unused]] int rank, [[maybe_unused]] int world_size,
                                            [[maybe_unused]] const BackendOptions& options) {
#ifdef FASTLEARN_WITH_NCCL
  report_nccl_failures_as_errors();
  auto nccl_options = c10d::ProcessGroupNCCL::Options::create();
  nccl_options->timeout = options.timeout;
  const int index = options.cuda_device >= 0 ? options.cuda_device : static_cast<int>(c10::cuda::current_device());
  const at::Device device(at::kCUDA, static_cast<c10::DeviceIndex>(index));
  auto backend = c10::make_intrusive<c10d::ProcessGroupNCCL>(store, rank, world_size, nccl_options);
  backend->setBoundDeviceId(device);
  backend->eagerConnectSingleDevice(device);
  return backend;
#else
  throw DistributedError("the NCCL backend is not compiled in: rebuild fastlearn against a LibTorch with CUDA");
#endif
}

}  // namespace

c10::intrusive_ptr<c10d::Backend> make_backend(BackendKind kind, const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                               int world_size, const BackendOptions& options) {
  if (!store) throw DistributedError(fmt::format("make_backend({}): no store given", to_string(kind)));
  if (world_size < 1 || rank < 0 || rank >= world_size) {
    throw DistributedError(
        fmt::format("make_backend({}): rank {} is out of range for world size {} (need 0 <= rank < "
                    "world size)",
                    to_string(kind), rank, world_size));
  }
  if (kind == BackendKind::threads) {
    throw DistributedError("make_backend: the threads backend connects threads of one process, not ranks over a store");
  }
  try {
    return kind == BackendKind::gloo ? make_gloo(store, rank, world_size, options)
                                     : make_nccl(store, rank, world_size, options);
  } catch (const DistributedError&) {
    throw;
  } catch (const std::exception& e) {
    throw DistributedError(fmt::format("rank {} of {}: could not create the {} backend: {}", rank, world_size,
                                       to_string(kind), error_text(e)));
  }
}

std::string error_text(const std::exception& e) {
  if (const auto* c10_error = dynamic_cast<const c10::Error*>(&e)) return c10_error->what_without_backtrace();
  return e.what();
}

void close_backend(c10d::Backend& backend, bool abort) {
  const auto name = backend.getBackendName();
  if (name == shared_memory_backend_name) {
    if (abort) backend.abort();  // the peers stop waiting on this rank
    return;
  }
  if (name != "nccl") return;
  try {
    if (abort) {
      backend.abort();
    } else {
      backend.shutdown();
    }
  } catch (const std::exception&) {
    if (!abort) backend.abort();  // a shutdown that fails still must not leave the communicator behind
  }
}

}  // namespace fastlearn
