#pragma once
// Annealing schedules, as fastai's callback/schedule.py: functions from the position in training
// (pos in [0, 1]) to a hyper-parameter value, and combine_scheds to chain them into phases (one-cycle is
// two cosine phases, see combined_cos).
#include <functional>
#include <vector>

namespace fastlearn {

using Schedule = std::function<double(double pos)>;

/// Linear from start (pos 0) to end (pos 1).
Schedule sched_lin(double start, double end);
/// Cosine from start to end: start + (1 + cos(pi*(1-pos))) * (end-start) / 2.
Schedule sched_cos(double start, double end);
/// Constant start (end is ignored, as in fastai).
Schedule sched_no(double start, double end);
/// Exponential: start * (end/start)^pos; start and end must be > 0 (ConfigError otherwise).
Schedule sched_exp(double start, double end);
/// Polynomial: start + (end-start) * pos^power; power must be > 0 (ConfigError otherwise).
Schedule sched_poly(double start, double end, double power);

/// Chains `scheds`: phase k covers a fraction pcts[k] of training and runs scheds[k] over its own [0, 1].
/// pcts must be >= 0 and sum to 1, with one schedule each (ConfigError otherwise). At a boundary the later
/// phase applies (zero-length phases are skipped), and pos == 1 is the last schedule at 1 (also when the
/// last phase has length 0). A pos outside [0, 1] (by more than 1e-9, which is clamped) is a ConfigError.
Schedule combine_scheds(std::vector<double> pcts, std::vector<Schedule> scheds);
/// Two cosine phases: start -> middle over the first `pct` of training, then middle -> end
/// (fastai's one-cycle shape; pct in [0, 1]).
Schedule combined_cos(double pct, double start, double middle, double end);

}  // namespace fastlearn
