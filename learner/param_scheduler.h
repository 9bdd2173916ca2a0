#pragma once
// ParamScheduler: sets the optimizer's hyper-parameters from schedules (learner/annealing.h) at every
// training batch; fit_one_cycle, fit_flat_cos and fine_tune (learner/param_scheduler.cpp) are built on it.
#include <fastlearn/learner/annealing.h>
#include <fastlearn/learner/callback.h>

#include <map>
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

}  // namespace fastlearn
