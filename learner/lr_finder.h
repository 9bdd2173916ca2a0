#pragma once
// LRFinder: lr_find's exponential learning-rate sweep, and fastai's four suggestion rules (same names, same
// results on the same curve as fastai 2.8's valley, slide, minimum and steep).
#include <fastlearn/learner/checkpoint.h>
#include <fastlearn/learner/learner.h>
#include <fastlearn/learner/param_scheduler.h>

#include <optional>
#include <vector>

namespace fastlearn {

/// The learning-rate range test: lr grows exponentially from start_lr to end_lr over num_it batches,
/// validation is skipped, and the model, optimizer, data order and RNG are restored at the end. Data parallel,
/// every rank records the mean of the ranks' losses (the global batch's loss): one curve on every rank, so the
/// same divergence stop at the same batch and the same suggestions.
class LRFinder : public ParamScheduler {
 public:
  explicit LRFinder(LrFindOptions options = {});
  std::string name() const override { return "lr_finder"; }
  int num_it() const { return options_.num_it; }

  void before_fit() override;
  void before_batch() override;
  void after_loss() override;
  /// Capturable in one process; in a job of several its after_loss gathers every rank's loss.
  CaptureSupport step_capture() const override;
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
/// fastai's "slide" rule: windows of `lr_diff` points move left from the end of the curve until the loss
/// gradients (per point, as numpy.gradient) at both ends of a window differ by at most `thresh`; the lr at
/// the left end of the last window that still differed.
double slide(const std::vector<double>& lrs, const std::vector<double>& losses, int lr_diff = 15,
             double thresh = 0.005);
/// fastai's "minimum" rule: the lr of the lowest loss, divided by 10.
double minimum(const std::vector<double>& lrs, const std::vector<double>& losses);
/// fastai's "steep" rule: the lr at the start of the segment where the loss falls fastest per log(lr).
double steep(const std::vector<double>& lrs, const std::vector<double>& losses);

}  // namespace fastlearn
