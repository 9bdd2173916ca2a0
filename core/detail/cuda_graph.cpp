#include <fastlearn/core/detail/cuda_graph.h>

#include <fastlearn/core/error.h>

#ifdef FASTLEARN_WITH_CUDA
#include <ATen/core/CachingHostAllocator.h>
#include <ATen/cuda/CUDAEvent.h>
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGraphsC10Utils.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace fastlearn {

#ifdef FASTLEARN_WITH_CUDA

bool cuda_graphs_built() { return true; }

bool stream_capturing(const c10::Device& device) {
  if (!device.is_cuda()) return false;
  const c10::cuda::CUDAGuard guard(device);
  return c10::cuda::currentStreamCaptureStatusMayInitCtx() != c10::cuda::CaptureStatus::None;
}

void run_on_side_stream(const c10::Device& device, const std::function<void()>& body) {
  if (!device.is_cuda()) return body();
  const c10::cuda::CUDAGuard guard(device);
  auto ambient = c10::cuda::getCurrentCUDAStream(device.index());
  auto side = c10::cuda::getStreamFromPool(/*isHighPriority=*/false, device.index());
  at::cuda::CUDAEvent queued;
  queued.record(ambient);
  queued.block(side);
  // The ambient stream waits for the side stream also when body throws (a callback cancelling the batch).
  struct Join {
    c10::cuda::CUDAStream& side;
    c10::cuda::CUDAStream& ambient;
    ~Join() {
      try {
        at::cuda::CUDAEvent done;
        done.record(side);
        done.block(ambient);
      } catch (...) {  // a destructor must not throw; a failing CUDA call shows again at the next one
      }
    }
  } join{side, ambient};
  const c10::cuda::CUDAStreamGuard on_side(side);
  body();
}

struct CapturedGraph::Impl {
  at::cuda::CUDAGraph graph;
  c10::Device device{c10::kCUDA};
  bool captured = false;
};

CapturedGraph::CapturedGraph() : impl_(std::make_unique<Impl>()) {}
CapturedGraph::~CapturedGraph() = default;

void CapturedGraph::capture(const c10::Device& device, GraphPool& pool, const std::function<void()>& body) {
  if (!device.is_cuda()) throw Error("CapturedGraph::capture: " + device.str() + " is not a CUDA device");
  if (impl_->captured) throw Error("CapturedGraph::capture: this graph is captured already");
  // Capture cannot run on the default stream: it runs on a side stream, in order with the ambient one.
  run_on_side_stream(device, [&] {
    // Thread-local mode: the loader's threads may pin and copy memory while this thread captures.
    impl_->graph.capture_begin(pool.id, cudaStreamCaptureModeThreadLocal);
    // A capture that fails must not leave the allocators routing this thread's allocations into its pool.
    const auto abandon = [&] {
      const auto id = impl_->graph.pool();
      try {
        c10::cuda::CUDACachingAllocator::endAllocateToPool(device.index(), id);
      } catch (...) {  // capture_end got that far already
      }
      try {
        at::getHostAllocator(at::kCUDA)->end_allocate_to_pool(id);
      } catch (...) {  // likewise, or this LibTorch's host allocator keeps no pools
      }
      try {
        impl_->graph.reset();
      } catch (...) {  // the graph is dropped either way
      }
    };
    try {
      body();
    } catch (...) {
      try {
        impl_->graph.capture_end();
      } catch (...) {  // the capture was invalid anyway: what body threw says why
      }
      abandon();
      throw;
    }
    try {
      impl_->graph.capture_end();
    } catch (...) {
      abandon();
      throw;
    }
  });
  if (pool.id == std::pair<unsigned long long, unsigned long long>{0, 0}) pool.id = impl_->graph.pool();
  impl_->device = device;
  impl_->captured = true;
}

void CapturedGraph::replay() {
  if (!impl_->captured) throw Error("CapturedGraph::replay: nothing was captured");
  const c10::cuda::CUDAGuard guard(impl_->device);
  impl_->graph.replay();
}

bool CapturedGraph::captured() const { return impl_->captured; }

#else

bool cuda_graphs_built() { return false; }
bool stream_capturing(const c10::Device& /*device*/) { return false; }
void run_on_side_stream(const c10::Device& /*device*/, const std::function<void()>& body) { body(); }

struct CapturedGraph::Impl {};
CapturedGraph::CapturedGraph() = default;
CapturedGraph::~CapturedGraph() = default;

void CapturedGraph::capture(const c10::Device& /*device*/, GraphPool& /*pool*/, const std::function<void()>& /*body*/) {
  throw Error("CapturedGraph::capture: this build of fastlearn has no CUDA");
}
void CapturedGraph::replay() { throw Error("CapturedGraph::replay: this build of fastlearn has no CUDA"); }
bool CapturedGraph::captured() const { return false; }

#endif

}  // namespace fastlearn
