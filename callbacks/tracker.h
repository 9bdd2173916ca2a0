#pragma once
// Callbacks that watch one recorded value epoch after epoch ("valid_loss" by default, or a metric):
// EarlyStopping, SaveModel and ReduceLROnPlateau (fastai's tracker callbacks).
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

struct SaveModelOptions {
  TrackerOptions tracker;
  std::string fname = "model";
  int every_epoch = 0;    ///< > 0: save <fname>_<epoch> every that many epochs instead of tracking the best
  bool at_end = false;    ///< save at the end of the fit (instead of loading the best back)
  bool with_opt = false;  ///< also save the optimizer state
};

/// Saves the model whenever the monitored value improves and loads the best one back at the end of the
/// fit; or saves every n epochs.
class SaveModel : public TrackerCallback {
 public:
  explicit SaveModel(SaveModelOptions options = {});
  std::string name() const override { return "save_model"; }
  void after_epoch() override;
  void after_fit() override;

 private:
  SaveModelOptions options_;
  bool saved_ = false;
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
