#include <fastlearn/callbacks/save_model.h>

#include <fastlearn/learner/learner.h>

#include <fmt/format.h>

namespace fastlearn {

SaveModel::SaveModel(SaveModelOptions options) : TrackerCallback(options.tracker), options_(std::move(options)) {}

void SaveModel::after_epoch() {
  auto& l = learn();
  if (options_.every_epoch > 0) {
    if (l.epoch % options_.every_epoch == 0)
      l.save(fmt::format("{}_{}", options_.fname, l.epoch_offset + l.epoch), {.with_opt = options_.with_opt});
    return;
  }
  TrackerCallback::after_epoch();
  if (new_best()) {
    l.save(options_.fname, {.with_opt = options_.with_opt});
    saved_ = true;
  }
}

void SaveModel::after_fit() {
  auto& l = learn();
  if (options_.at_end) {
    l.save(options_.fname, {.with_opt = options_.with_opt});
  } else if (options_.every_epoch == 0 && saved_) {
    l.load(options_.fname, {.with_opt = options_.with_opt});
  }
  saved_ = false;
}

}  // namespace fastlearn
