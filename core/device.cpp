#include <fastlearn/core/device.h>

#include <fastlearn/core/error.h>

#include <fmt/format.h>
#include <torch/cuda.h>
#ifdef FASTLEARN_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAFunctions.h>
#endif

#include <charconv>
#include <cstdlib>
#include <optional>
#include <string_view>

namespace fastlearn {

namespace {

// A non-negative integer from the environment; nothing when unset or not a number (the distributed runtime
// names malformed values when it sets up).
std::optional<int> env_count(const char* name) {
  const char* value = std::getenv(name);
  if (!value || !*value) return std::nullopt;
  const std::string_view text(value);
  int n = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), n);
  if (ec != std::errc() || end != text.data() + text.size() || n < 0) return std::nullopt;
  return n;
}

int current_cuda_device() {
#ifdef FASTLEARN_WITH_CUDA
  return c10::cuda::current_device();
#else
  return 0;
#endif
}

}  // namespace

c10::Device default_device() {
  if (!torch::cuda::is_available()) return c10::Device(c10::kCPU);
  const int gpus = static_cast<int>(torch::cuda::device_count());
  const auto local_world = env_count("LOCAL_WORLD_SIZE");
  const auto local_rank = env_count("LOCAL_RANK");
  if (local_world && *local_world > 1 && local_rank) {
    if (*local_world > gpus || *local_rank >= gpus) return c10::Device(c10::kCPU);
    return {c10::kCUDA, static_cast<c10::DeviceIndex>(*local_rank)};
  }
  return {c10::kCUDA, static_cast<c10::DeviceIndex>(current_cuda_device())};
}

c10::Device resolve_device(c10::Device device, const char* what) {
  if (device.is_cpu()) return c10::Device(c10::kCPU);
  if (!device.is_cuda()) {
    throw ConfigError(
        fmt::format("{}: '{}' is not supported; fastlearn computes on \"cpu\" or \"cuda[:N]\"", what, device.str()));
  }
  if (!torch::cuda::is_available()) {
    throw ConfigError(
        fmt::format("{}: '{}' needs a CUDA GPU and none is visible{}; use \"cpu\", or \"auto\" (a GPU "
                    "when there is one)",
                    what, device.str(), std::getenv("CUDA_VISIBLE_DEVICES") ? " (CUDA_VISIBLE_DEVICES is set)" : ""));
  }
  const int gpus = static_cast<int>(torch::cuda::device_count());
  if (!device.has_index()) {
    const auto fallback = default_device();
    return fallback.is_cuda() ? fallback
                              : c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(current_cuda_device()));
  }
  if (device.index() >= gpus) {
    throw ConfigError(fmt::format("{}: '{}' does not exist: {} GPU(s) are visible (cuda:0{})", what, device.str(), gpus,
                                  gpus > 1 ? fmt::format(" to cuda:{}", gpus - 1) : ""));
  }
  return device;
}

std::string describe_device(const c10::Device& device) {
#ifdef FASTLEARN_WITH_CUDA
  if (device.is_cuda() && device.has_index())
    return fmt::format("{} ({})", device.str(), at::cuda::getDeviceProperties(device.index())->name);
#endif
  return device.str();
}

}  // namespace fastlearn
