#pragma once
// Callbacks that watch one recorded value epoch after epoch ("valid_loss" by default, or a metric):
// EarlyStopping and ReduceLROnPlateau (fastai's tracker callbacks; SaveModel is in callbacks/save_model.h).
#include <fastlearn/learner/callback.h>

#include <optional>
#include <string>

namespace fastlearn {

/// Which way is better for the monitored value.
enum class Compare { automatic, lower, higher };

struct TrackerOptions {
  std::string monitor = "valid_loss";
  Compare comp = Compare::automatic;  ///< automatic: lower for names containing "loss" or "error", higher otherwise
  double min_delta = 0.0;             ///< an improvement must be larger than this
  bool reset_on_fit = true;           ///< forget the best value at each fit
};

/// Tracks the best value of `monitor`; after each epoch, new_best() tells whether it improved.
class TrackerCallback : public Callback {
 public:
  explicit TrackerCallback(TrackerOptions options);
  void before_fit() override;
  void after_epoch() override;

  double best() const { return best_; }
  bool new_best() const { return new_best_; }
  const TrackerOptions& tracker_options() const { return options_; }

 protected:
  /// The monitored value of the last epoch.
  double current() const;

 private:
  bool better(double value) const;
  TrackerOptions options_;
  bool lower_is_better_ = true;
  double best_ = 0;
  bool new_best_ = false;
  bool started_ = false;
};

struct EarlyStoppingOptions {
  TrackerOptions tracker;
  int patience = 1;  ///< epochs without improvement before stopping
};

/// Stops the fit after `patience` epochs without improvement.
class EarlyStopping : public TrackerCallback {
 public:
  explicit EarlyStopping(EarlyStoppingOptions options = {});
  std::string name() const override { return "early_stopping"; }
  void before_fit() override;
  void after_epoch() override;
  /// The epoch after which the fit stopped, if it did.
  std::optional<int> stopped_after() const { return stopped_after_; }

 private:
  int patience_;
  int wait_ = 0;
  std::optional<int> stopped_after_;
};

struct ReduceLROnPlateauOptions {
  TrackerOptions tracker;
  int patience = 1;
  double factor = 10.0;  ///< lr is divided by this
  double min_lr = 0.0;
};

/// Divides every group's learning rate by `factor` after `patience` epochs without improvement.
class ReduceLROnPlateau : public TrackerCallback {
 public:
  explicit ReduceLROnPlateau(ReduceLROnPlateauOptions options = {});
  std::string name() const override { return "reduce_lr_on_plateau"; }
  void before_fit() override;
  void after_epoch() override;

 private:
  ReduceLROnPlateauOptions options_;
  int wait_ = 0;
};

}  // namespace fastlearn
