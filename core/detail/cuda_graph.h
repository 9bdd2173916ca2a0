#pragma once
// The CUDA graph calls fastlearn makes, behind one small interface (the one file that includes ATen's CUDA graph
// header): capture what a function launches on a GPU into a graph with memory from a private pool, and replay it
// on the current stream as one launch. In a build without CUDA nothing is ever capturing and capture is an Error.
#include <c10/core/Device.h>

#include <functional>
#include <memory>
#include <utility>

namespace fastlearn {

/// Whether this build can capture CUDA graphs (LibTorch with CUDA).
bool cuda_graphs_built();
/// Whether the current stream of `device` is being captured (false on the CPU).
bool stream_capturing(const c10::Device& device);

/// Runs `body` with a side stream of `device` as its current stream, after what the current stream queued (which then
/// waits for it): the way warm-up steps run before a capture (as PyTorch's recipe has them). On the CPU, just `body`.
void run_on_side_stream(const c10::Device& device, const std::function<void()>& body);

/// The memory pool the graphs of one owner share: they are replayed one at a time on one stream, so what one graph
/// frees at the end of its capture another may use, and the memory stays bounded by the largest graph's.
struct GraphPool {
  std::pair<unsigned long long, unsigned long long> id{0, 0};  ///< {0, 0}: none yet (the first capture makes it)
};

class CapturedGraph {
 public:
  CapturedGraph();
  ~CapturedGraph();
  CapturedGraph(const CapturedGraph&) = delete;
  CapturedGraph& operator=(const CapturedGraph&) = delete;

  /// Runs `body` once on the host while the kernels it launches on `device` are captured, not run: on a side stream
  /// that first waits for the current one (the current one then waits for it), with allocations from `pool`. Only
  /// this thread is held to capture's rules, so loader threads may go on copying. An exception from `body` ends the
  /// capture and is rethrown; the graph stays empty.
  void capture(const c10::Device& device, GraphPool& pool, const std::function<void()>& body);
  /// Launches the captured kernels on the current stream of the capture's device.
  void replay();
  bool captured() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace fastlearn
