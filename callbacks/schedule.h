#pragma once
// Schedules applied to the optimizer's hyper-parameters during training: ParamScheduler (what
// fit_one_cycle and fit_flat_cos use) and LRFinder (lr_find's exponential sweep), plus the "valley"
// learning-rate suggestion.
#include <fastlearn/learner/annealing.h>
#include <fastlearn/learner/callback.h>
#include <fastlearn/learner/checkpoint.h>

#include <map>
#include <optional>
#include <string>
#include <vector>

namespace fastlearn {

/// Before every training batch, sets each scheduled hyper-parameter to its schedule's value at the
/// fit's progress (pct_train); records the values it set.
class ParamScheduler : public Callback {
 public:
  /// Hyper-parameter name ("lr", "mom", "wd", ...) -> one schedule for every group, or one per group.
  using Schedules = std::map<std::string, std::vector<Schedule>>;
  explicit ParamScheduler(Schedules scheds);
  std::string name() const override { return "param_scheduler"; }

  void before_fit() override;
  void before_batch() override;
  void after_batch() override;

  /// The value of the last group's hyper-parameters at every training batch of the fit.
  const std::map<std::string, std::vector<double>>& hps() const { return hps_; }

 protected:
  /// Sets every scheduled hyper-parameter to its value at `pos` in [0, 1].
  void apply(double pos);

 private:
  Schedules scheds_;
  std::map<std::string, std::vector<double>> hps_;
};

struct LRFinderOptions {
  double start_lr = 1e-7;
  double end_lr = 10;
  int num_it = 100;      ///< at least 6
  bool stop_div = true;  ///< stop once the smoothed loss exceeds 4x the best smoothed loss
};

/// The learning-rate range test: lr grows exponentially from start_lr to end_lr over num_it batches,
/// validation is skipped, and the model, optimizer, data order and RNG are restored at the end.
class LRFinder : public ParamScheduler {
 public:
  explicit LRFinder(LRFinderOptions options = {});
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
  LRFinderOptions options_;
  double best_loss_ = 0;
  std::optional<CheckpointState> saved_;
};

/// True while an LRFinder is attached: trackers and file logs stand aside during the sweep (as fastai).
bool lr_finder_attached(const Learner& learn);

/// fastai's "valley" rule: the lr a third and a half into the longest strictly decreasing run of losses.
double valley(const std::vector<double>& lrs, const std::vector<double>& losses);

}  // namespace fastlearn
