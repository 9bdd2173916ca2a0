#pragma once
// ChannelsLast: trains in the channels-last (NHWC) memory format (models/memory_format.h): the model
// before fitting, the 4-D inputs of every batch. oneDNN's CPU convolutions run it faster
// (bench/README.md has the measurements). Parameters keep their identity, so an
// optimizer built before still updates them, and the reducer and optimizer follow the layout without copies.
#include <fastlearn/learner/callback.h>
#include <fastlearn/learner/callback_order.h>
#include <fastlearn/models/memory_format.h>

namespace fastlearn {

class ChannelsLast : public Callback {
 public:
  ChannelsLast() { order = cb_order::channels_last; }
  std::string name() const override { return "channels_last"; }
  void before_fit() override;    // the model
  void before_batch() override;  // 4-D inputs
};

}  // namespace fastlearn
