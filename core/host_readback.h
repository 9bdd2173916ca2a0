#pragma once
// HostReadback: numbers computed on a device (a batch's loss, a flag carried by a collective) brought to
// the host without making the host wait for the device. On CPU a value is readable at once. On CUDA each
// value is copied into pinned memory on the device's stream and becomes readable one push later, when
// the copy has long finished: reading it then costs an event query, not a pipeline stall.
#include <ATen/core/Tensor.h>

#include <cstddef>
#include <deque>
#include <memory>
#include <vector>

namespace c10 {
struct Event;
}

namespace fastlearn {

class HostReadback {
 public:
  HostReadback();
  ~HostReadback();
  HostReadback(HostReadback&&) noexcept;
  HostReadback& operator=(HostReadback&&) noexcept;

  /// Starts bringing `value` (one element, any dtype and device) to the host.
  void push(const at::Tensor& value);
  /// The values that can be read without waiting, oldest first (every one pushed on CPU; all but the
  /// newest on CUDA); they are removed.
  std::vector<double> take_ready();
  /// Every value pushed and not taken yet, waiting for the device if it must (ends of epochs, checkpoints).
  std::vector<double> take_all();
  /// Values pushed and not taken yet.
  std::size_t pending() const { return pending_.size(); }
  void clear();

 private:
  struct Pending;
  std::deque<std::unique_ptr<Pending>> pending_;
};

}  // namespace fastlearn
