#include <fastlearn/data/batch.h>

#include <torch/torch.h>

namespace fastlearn {
namespace {

template <typename Fn>
Batch map_tensors(const Batch& batch, Fn&& fn) {
  Batch out;
  out.inputs.reserve(batch.inputs.size());
  out.targets.reserve(batch.targets.size());
  for (const auto& t : batch.inputs) out.inputs.push_back(fn(t));
  for (const auto& t : batch.targets) out.targets.push_back(fn(t));
  return out;
}

}  // namespace

std::int64_t Batch::size() const {
  if (!inputs.empty() && inputs.front().dim() > 0) return inputs.front().size(0);
  if (!targets.empty() && targets.front().dim() > 0) return targets.front().size(0);
  return 0;
}

Batch Batch::to(const c10::Device& device, bool non_blocking) const {
  return map_tensors(*this, [&](const at::Tensor& t) { return t.to(device, non_blocking); });
}

Batch Batch::pinned() const {
  // Only host memory can be pinned; a batch already on a GPU stays where it is.
  return map_tensors(*this, [](const at::Tensor& t) { return !t.is_cpu() || t.is_pinned() ? t : t.pin_memory(); });
}

}  // namespace fastlearn
