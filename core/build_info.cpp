#include <fastlearn/core/build_info.h>

#include <ATen/detail/CUDAHooksInterface.h>
#include <fmt/format.h>
#include <torch/cuda.h>
#ifdef FASTLEARN_WITH_NCCL
#include <torch/csrc/distributed/c10d/NCCLUtils.hpp>
#endif

namespace fastlearn {

BuildInfo build_info() {
  BuildInfo info;
  info.fastlearn_version = FASTLEARN_VERSION;
  info.torch_version = FASTLEARN_TORCH_VERSION;
#ifdef FASTLEARN_WITH_CUDA
  // The hooks are registered by libtorch_cuda; their presence proves CUDA is linked, not just declared.
  info.cuda = at::detail::getCUDAHooks().isBuilt();
  info.cuda_version = FASTLEARN_CUDA_VERSION;
  info.cuda_devices = static_cast<int>(torch::cuda::device_count());
#endif
#ifdef FASTLEARN_WITH_NCCL
  info.nccl = true;
  info.nccl_version = c10d::getNcclVersion();
#endif
#ifdef FASTLEARN_WITH_GLOO
  info.gloo = true;
#endif
  return info;
}

std::string describe(const BuildInfo& info) {
  auto yes_no = [](bool on) { return on ? "yes" : "no"; };
  std::string out = fmt::format("fastlearn {}\nLibTorch {}\n", info.fastlearn_version, info.torch_version);
  out += fmt::format("CUDA: {}", yes_no(info.cuda));
  if (info.cuda) out += fmt::format(" (CUDA {}, {} device(s) visible)", info.cuda_version, info.cuda_devices);
  out += fmt::format("\nNCCL: {}", yes_no(info.nccl));
  if (info.nccl) out += fmt::format(" (library {})", info.nccl_version);
  out += fmt::format("\nGloo: {}\n", yes_no(info.gloo));
  return out;
}

}  // namespace fastlearn
