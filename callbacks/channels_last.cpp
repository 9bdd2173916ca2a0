#include <fastlearn/callbacks/channels_last.h>

#include <fastlearn/learner/learner.h>

namespace fastlearn {

void ChannelsLast::before_fit() { models::to_channels_last(learn().model()); }

void ChannelsLast::before_batch() {
  for (auto& x : learn().xb) x = models::as_channels_last(x);
}

}  // namespace fastlearn
