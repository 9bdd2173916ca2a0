#include <fastlearn/callbacks/tracker.h>

#include <fastlearn/core/detail/text.h>
#include <fastlearn/core/error.h>
#include <fastlearn/learner/callback_order.h>
#include <fastlearn/learner/learner.h>
#include <fastlearn/learner/lr_finder.h>
#include <fastlearn/learner/recorder.h>

#include <algorithm>

#include <fmt/format.h>

#include <cmath>
#include <limits>

namespace fastlearn {

TrackerCallback::TrackerCallback(TrackerOptions options) : options_(std::move(options)) {
  order = cb_order::trackers;
  if (options_.comp == Compare::automatic) {
    lower_is_better_ =
        options_.monitor.find("loss") != std::string::npos || options_.monitor.find("error") != std::string::npos;
  } else {
    lower_is_better_ = options_.comp == Compare::lower;
  }
}

void TrackerCallback::before_fit() {
  // An unknown monitor fails now, not after the first epoch (nor after the lr_find sweep that precedes the fit).
  const auto& rec = learn().recorder();
  const auto names = rec.metric_names();
  if (options_.monitor != "train_loss" && options_.monitor != "valid_loss" &&
      std::find(names.begin(), names.end(), options_.monitor) == names.end()) {
    rec.value(EpochRecord{}, options_.monitor);  // throws the error listing the recorded values
  }
  // Nothing to track in an lr_find sweep (validation is skipped); fastai disables trackers there too.
  if (lr_finder_attached(learn())) {
    run = false;
    return;
  }
  if (options_.reset_on_fit || !started_) {
    best_ = lower_is_better_ ? std::numeric_limits<double>::infinity() : -std::numeric_limits<double>::infinity();
  }
  started_ = true;
  new_best_ = false;
}

double TrackerCallback::current() const {
  const auto& rec = learn().recorder();
  if (rec.history().empty()) throw Error(name() + ": no epoch recorded yet");
  return rec.value(rec.history().back(), options_.monitor);
}

bool TrackerCallback::better(double value) const {
  if (std::isnan(value)) return false;
  return lower_is_better_ ? value + options_.min_delta < best_ : value - options_.min_delta > best_;
}

void TrackerCallback::after_epoch() {
  const double value = current();
  new_best_ = better(value);
  if (new_best_) best_ = value;
}

EarlyStopping::EarlyStopping(EarlyStoppingOptions options)
    : TrackerCallback(std::move(options.tracker)), patience_(options.patience) {}

void EarlyStopping::before_fit() {
  TrackerCallback::before_fit();
  wait_ = 0;
  stopped_after_.reset();
}

void EarlyStopping::after_epoch() {
  TrackerCallback::after_epoch();
  wait_ = new_best() ? 0 : wait_ + 1;
  if (wait_ >= patience_) {
    stopped_after_ = learn().epoch;
    fmt::print("No improvement of {} since epoch {}: early stopping\n", excerpt(tracker_options().monitor),
               learn().epoch - wait_);
    throw CancelFitException();
  }
}

ReduceLROnPlateau::ReduceLROnPlateau(ReduceLROnPlateauOptions options)
    : TrackerCallback(options.tracker), options_(std::move(options)) {}

void ReduceLROnPlateau::before_fit() {
  TrackerCallback::before_fit();
  wait_ = 0;
}

void ReduceLROnPlateau::after_epoch() {
  TrackerCallback::after_epoch();
  if (new_best()) {
    wait_ = 0;
    return;
  }
  if (++wait_ < options_.patience) return;
  auto& opt = learn().opt();
  std::vector<double> lrs;
  for (std::size_t g = 0; g < opt.n_groups(); ++g) {
    lrs.push_back(std::max(opt.hyper("lr", g) / options_.factor, options_.min_lr));
  }
  opt.set_hyper("lr", lrs);
  wait_ = 0;
}

}  // namespace fastlearn
