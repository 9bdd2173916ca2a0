#pragma once
// Training inside a running program: the program owns the loop and hands the Learner one batch at a time
// (Learner::begin_steps, train_step, end_steps; predict_batch in between). The steps are a real fit, run on the
// program's own thread in turns with the program (a fiber: a stack of its own, no second thread, so no second OpenMP
// team fighting the program's for the cores): one of the Learner's fits (fit_one_cycle by default) over
// plan.steps / plan.steps_per_epoch epochs of plan.steps_per_epoch batches, whose training loader yields the batches
// train_step hands over. So every event fires in fit's order and every callback works as in a fit: schedules by step,
// GradientClip, GradientAccumulation, MixedPrecision, Checkpointer, the logs, GracefulStop, validation and the
// metrics after each epoch (on the samples the program held out, or the Learner's validation loader). train_step
// returns once the step and what follows it (an epoch's end, validation, the fit's end) are done, so nothing of the
// Learner runs while the program's code does. Each side keeps its own thread state (grad mode, autocast, the current
// device, the OpenMP team size, the dropout generator): the program's guards do not reach into the fit, nor the
// fit's into the program.
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <vector>

namespace fastlearn {

class Learner;

struct StepPlan {
  std::int64_t steps = 0;            ///< training steps the schedule is planned for; > 0
  std::int64_t steps_per_epoch = 0;  ///< steps between epoch ends (validation, records, logs); 0: steps. Divides steps
  /// > 0: the validation set of every epoch end is the last this many samples the program set aside with
  /// Learner::hold_out (instead of dls().valid()), kept in checkpoints so that a resumed run validates on the same.
  std::int64_t held_out = 0;
  std::int64_t valid_bs = 256;  ///< batch size of the held-out samples' validation
};

/// Which fit trains the steps: called inside the steps' fiber with the number of epochs, e.g.
/// `[](fl::Learner& l, int n_epoch) { l.fit_flat_cos(n_epoch, 1e-3); }`. Default: fit_one_cycle(n_epoch) at the
/// Learner's lr. With FitOptions::resume_from (a Checkpointer's checkpoint of earlier steps) the fit continues where
/// the checkpoint was taken, bit for bit on the CPU: when begin_steps returns, learn.train_iter is the number of steps
/// already trained, and the program hands over its batches from that step on.
using StepFit = std::function<void(Learner& learn, int n_epoch)>;

}  // namespace fastlearn
