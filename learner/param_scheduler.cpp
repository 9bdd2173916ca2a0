#include <fastlearn/learner/param_scheduler.h>

#include <fastlearn/core/error.h>
#include <fastlearn/core/safetensors.h>
#include <fastlearn/learner/callback_order.h>
#include <fastlearn/learner/checkpoint.h>
#include <fastlearn/learner/learner.h>

#include <fmt/format.h>

#include <filesystem>

namespace fastlearn {

ParamScheduler::ParamScheduler(Schedules scheds) : scheds_(std::move(scheds)) {
  order = cb_order::schedulers;
  run_valid = false;
  for (const auto& [hyper, list] : scheds_) {
    if (list.empty()) throw ConfigError("ParamScheduler: no schedule for '" + hyper + "'");
  }
}

void ParamScheduler::before_fit() {
  hps_.clear();
  for (const auto& [hyper, list] : scheds_) hps_[hyper];
}

void ParamScheduler::before_batch() { apply(learn().pct_train); }

void ParamScheduler::apply(double pos) {
  auto& opt = learn().opt();
  const auto groups = opt.n_groups();
  for (const auto& [hyper, list] : scheds_) {
    if (list.size() != 1 && list.size() != groups) {
      throw ConfigError(fmt::format("ParamScheduler: {} schedules for '{}' but the optimizer has {} parameter groups",
                                    list.size(), hyper, groups));
    }
    std::vector<double> values;
    for (const auto& sched : list) values.push_back(sched(pos));
    opt.set_hyper(hyper, values);
  }
}

void ParamScheduler::after_batch() {
  auto& opt = learn().opt();
  for (auto& [hyper, values] : hps_) values.push_back(opt.hyper(hyper, opt.n_groups() - 1));
}

// --- the fit policies built on it (fastai patches them onto Learner in callback/schedule.py) -----------

void Learner::fit_one_cycle(int n_epoch_, std::optional<LrSpec> lr_max, OneCycleOptions options) {
  check_not_in_fit("fit_one_cycle");
  if (options.fit.reset_opt || !opt_) create_opt();
  options.fit.reset_opt = false;
  const auto lrs = lr_max.value_or(LrSpec(options_.lr)).per_group(opt_->n_groups());
  const auto moms = options.moms.value_or(options_.moms);
  ParamScheduler::Schedules scheds;
  for (double lr : lrs) {
    scheds["lr"].push_back(combined_cos(options.pct_start, lr / options.div, lr, lr / options.div_final));
  }
  scheds["mom"].push_back(combined_cos(options.pct_start, moms[0], moms[1], moms[2]));
  options.fit.cbs.insert(options.fit.cbs.begin(), std::make_shared<ParamScheduler>(std::move(scheds)));
  run_fit(n_epoch_, lrs, std::move(options.fit));
}

void Learner::fit_flat_cos(int n_epoch_, std::optional<LrSpec> lr, FlatCosOptions options) {
  check_not_in_fit("fit_flat_cos");
  if (options.fit.reset_opt || !opt_) create_opt();
  options.fit.reset_opt = false;
  const auto lrs = lr.value_or(LrSpec(options_.lr)).per_group(opt_->n_groups());
  ParamScheduler::Schedules scheds;
  for (double value : lrs)
    scheds["lr"].push_back(combined_cos(options.pct_start, value, value, value / options.div_final));
  options.fit.cbs.insert(options.fit.cbs.begin(), std::make_shared<ParamScheduler>(std::move(scheds)));
  run_fit(n_epoch_, lrs, std::move(options.fit));
}

// The two fits are phases "frozen" and "unfrozen" (FitOptions::phase), the second numbering its epochs after the
// first's: their checkpoints say which fit they belong to and are named in one sequence, so the newest is the one
// to resume. Resuming from a checkpoint of the unfrozen fit skips the frozen fit (the checkpoint holds everything
// the unfrozen fit needs: weights, optimizer, RNG states, data order); one of the frozen fit resumes it and then
// runs the unfrozen fit from its start.
void Learner::fine_tune(int epochs, double base_lr, FineTuneOptions options) {
  check_not_in_fit("fine_tune");
  if (options.freeze_epochs < 0) {
    throw ConfigError(fmt::format("fine_tune: freeze_epochs must be >= 0, got {}", options.freeze_epochs));
  }
  auto resume_from = std::move(options.fit.resume_from);
  options.fit.resume_from.clear();
  bool resume_unfrozen = false;
  // Every rank peeks at the file only once a checkpoint rank 0 may still be writing is complete.
  if (!resume_from.empty() && coordination_.barrier) coordination_.barrier();
  if (!resume_from.empty() && std::filesystem::exists(resume_from)) {  // a missing file: the frozen fit says so
    const CheckpointState header{.tensors = {}, .metadata = load_safetensors_metadata(resume_from)};
    const auto position = fit_position(header, resume_from.string());
    resume_unfrozen = position && position->phase == "unfrozen";
  }
  if (!resume_unfrozen) {
    freeze();
    auto frozen = options.fit;
    frozen.resume_from = resume_from;
    frozen.phase = "frozen";
    fit_one_cycle(options.freeze_epochs, LrSpec::slice(base_lr), {.pct_start = 0.99, .fit = std::move(frozen)});
    if (training_stopped_) return;  // stopped by a signal (with a checkpoint): the unfrozen fit does not start
  }
  base_lr /= 2;
  unfreeze();
  auto unfrozen = std::move(options.fit);
  if (resume_unfrozen) unfrozen.resume_from = std::move(resume_from);
  unfrozen.phase = "unfrozen";
  unfrozen.epoch_offset = options.freeze_epochs;
  fit_one_cycle(epochs, LrSpec::slice(base_lr / options.lr_mult, base_lr),
                {.div = options.div, .pct_start = options.pct_start, .fit = std::move(unfrozen)});
}

}  // namespace fastlearn
