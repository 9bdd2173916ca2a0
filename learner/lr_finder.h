#pragma once
// LRFinder: lr_find's exponential learning-rate sweep, and fastai's "valley" suggestion.
#include <fastlearn/learner/checkpoint.h>
#include <fastlearn/learner/learner.h>
#include <fastlearn/learner/param_scheduler.h>

#include <optional>
#include <vector>

namespace fastlearn {

/// The learning-rate range test: lr grows exponentially from start_lr to end_lr over num_it batches,
/// validation is skipped, and the model, optimizer, data order and RNG are restored at the end.
class LRFinder : public ParamScheduler {
 public:
  explicit LRFinder(LrFindOptions options = {});
  std::string name() const override { return "lr_finder"; }
  int num_it() const { return options_.num_it; }

  void before_fit() override;
  void before_batch() override;
  void after_batch() override;
  void before_validate() override;
  void after_fit() override;
  /// Puts back the state saved at before_fit (done by after_fit; lr_find also calls it on an error).
  void restore();

 private:
  LrFindOptions options_;
  double best_loss_ = 0;
  std::optional<CheckpointState> saved_;
};

/// True while an LRFinder is attached: trackers and file logs stand aside during the sweep (as fastai).
bool lr_finder_attached(const Learner& learn);

/// fastai's "valley" rule: the lr a third and a half into the longest strictly decreasing run of losses.
double valley(const std::vector<double>& lrs, const std::vector<double>& losses);

}  // namespace fastlearn
