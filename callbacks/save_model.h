#pragma once
// SaveModel: keeps the best model of a fit (fastai's SaveModelCallback), a tracker callback. Complete
// checkpoints for resuming are the Checkpointer's (callbacks/checkpointing.h); the file format is
// learner/checkpoint.h.
#include <fastlearn/callbacks/tracker.h>

#include <string>

namespace fastlearn {

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

}  // namespace fastlearn
