#include <fastlearn/core/host_readback.h>

#include <fastlearn/core/error.h>

#include <ATen/ATen.h>
#include <c10/core/Event.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <optional>

namespace fastlearn {

struct HostReadback::Pending {
  double value = 0;  // set at once for a CPU value
  at::Tensor host;   // pinned copy of a device value, valid once `copied` has completed
  std::optional<c10::Event> copied;

  double read() {
    if (!copied) return value;
    copied->synchronize();
    return host.item<double>();
  }
};

HostReadback::HostReadback() = default;
HostReadback::~HostReadback() = default;
HostReadback::HostReadback(HostReadback&&) noexcept = default;
HostReadback& HostReadback::operator=(HostReadback&&) noexcept = default;

void HostReadback::push(const at::Tensor& value) {
  if (!value.defined() || value.numel() != 1) {
    throw Error("HostReadback: a value to read back must be one element, got " +
                (value.defined() ? std::to_string(value.numel()) + " elements" : std::string("no tensor")));
  }
  auto pending = std::make_unique<Pending>();
  if (value.is_cpu()) {
    pending->value = value.item<double>();
  } else {
    const auto device = value.device();
    pending->host = at::empty({1}, value.options().device(at::kCPU).pinned_memory(true));
    pending->host.copy_(value.reshape({1}), /*non_blocking=*/true);
    const auto* guard = c10::impl::getDeviceGuardImpl(device.type());
    pending->copied.emplace(device.type());
    pending->copied->record(guard->getStream(device));
  }
  pending_.push_back(std::move(pending));
}

std::vector<double> HostReadback::take_ready() {
  std::vector<double> values;
  // A device value waits for the next push: by then its copy is done, so reading it does not block.
  while (!pending_.empty() && (!pending_.front()->copied || pending_.size() > 1)) {
    values.push_back(pending_.front()->read());
    pending_.pop_front();
  }
  return values;
}

void HostReadback::clear() { pending_.clear(); }

std::vector<double> HostReadback::take_all() {
  std::vector<double> values;
  for (auto& p : pending_) values.push_back(p->read());
  pending_.clear();
  return values;
}

}  // namespace fastlearn
