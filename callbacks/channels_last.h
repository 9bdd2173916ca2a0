#pragma once
// ChannelsLast: trains in the channels-last (NHWC) memory format. The values are the same; only their
// order in memory changes, and oneDNN's CPU convolutions run it faster (bench/README.md: 5-25% per step
// on this project's conv nets). Parameters keep their identity, so an optimizer built before still
// updates them, and the reducer and optimizer follow the layout without copies.
#include <fastlearn/learner/callback.h>
#include <fastlearn/learner/callback_order.h>

namespace torch::nn {
class Module;
}

namespace fastlearn {

/// Puts every 4-D parameter (and its gradient) and buffer of `model` in channels-last memory format, in
/// place: the tensors stay the same objects, so optimizers and hooks that hold them see the change.
void to_channels_last(torch::nn::Module& model);

class ChannelsLast : public Callback {
 public:
  ChannelsLast() { order = cb_order::channels_last; }
  std::string name() const override { return "channels_last"; }
  void before_fit() override;    // the model
  void before_batch() override;  // 4-D inputs
};

}  // namespace fastlearn
