#pragma once
// What this build of fastlearn contains: versions and the compiled-in backends.
#include <string>

namespace fastlearn {

struct BuildInfo {
  std::string fastlearn_version;
  std::string torch_version;  ///< LibTorch version fastlearn was built against
  bool cuda = false;          ///< LibTorch's CUDA support compiled in and linked
  std::string cuda_version;   ///< CUDA version LibTorch was built with ("" without CUDA)
  int cuda_devices = 0;       ///< GPUs visible now (0 on a CPU-only machine)
  bool nccl = false;          ///< c10d NCCL backend compiled in
  std::string nccl_version;   ///< version of the NCCL library loaded at run time
  bool gloo = false;          ///< c10d Gloo backend compiled in
};

/// Describes this build; probes the CUDA runtime for the device count, never needs a GPU.
BuildInfo build_info();

/// Multi-line human-readable form, as printed by `fastlearn --version`.
std::string describe(const BuildInfo& info);

}  // namespace fastlearn
