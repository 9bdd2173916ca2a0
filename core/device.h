#pragma once
// Where fastlearn computes when the program does not say: fastai's default_device.
#include <c10/core/Device.h>

#include <string>

namespace fastlearn {

/// A CUDA GPU when one is visible, else the CPU. In a job with several ranks on this host (LOCAL_RANK and
/// LOCAL_WORLD_SIZE, as `fastlearn launch` and torchrun set them): the local rank's own GPU when every local rank
/// has one, else the CPU, so that ranks never pile onto GPU 0 (data parallel training then goes over Gloo on the
/// CPU; see comm/runtime.h). Outside such a job: CUDA's current device.
c10::Device default_device();

/// `device` made concrete: "cuda" without an index becomes default_device()'s GPU when that is one, else CUDA's
/// current device. ConfigError, naming `what`, for a CUDA device where no GPU is visible or one beyond the GPUs
/// there are, and for devices other than the CPU and CUDA.
c10::Device resolve_device(c10::Device device, const char* what = "device");

/// "cpu", or "cuda:0 (NVIDIA H100 80GB HBM3)": a device as a person reads it.
std::string describe_device(const c10::Device& device);

}  // namespace fastlearn
