#include <fastlearn/callbacks/schedule.h>

#include <fastlearn/core/error.h>
#include <fastlearn/learner/learner.h>
#include <fastlearn/learner/recorder.h>

#include <fmt/format.h>

#include <limits>

namespace fastlearn {

ParamScheduler::ParamScheduler(Schedules scheds) : scheds_(std::move(scheds)) {
  order = 60;
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

LRFinder::LRFinder(LRFinderOptions options)
    : ParamScheduler({{"lr", {sched_exp(options.start_lr, options.end_lr)}}}), options_(options) {
  options_.num_it = std::max(options_.num_it, 6);
}

void LRFinder::before_fit() {
  ParamScheduler::before_fit();
  learn().recorder().read_every_batch(true);  // the divergence check needs this batch's loss now
  saved_ = capture_state(learn(), {.with_opt = true});
  best_loss_ = std::numeric_limits<double>::infinity();
}

void LRFinder::before_batch() { apply(static_cast<double>(learn().train_iter) / options_.num_it); }

void LRFinder::after_batch() {
  ParamScheduler::after_batch();
  auto& l = learn();
  if (l.smooth_loss < best_loss_) best_loss_ = l.smooth_loss;
  // train_iter counts this batch only after TrainEval's after_batch, which runs first (order -10).
  if (options_.stop_div && (l.smooth_loss > 4 * best_loss_ || std::isnan(l.smooth_loss))) throw CancelFitException();
  if (l.train_iter >= options_.num_it) throw CancelFitException();
}

void LRFinder::before_validate() { throw CancelValidException(); }

void LRFinder::after_fit() {
  learn().recorder().read_every_batch(false);
  if (learn().has_opt()) learn().opt().zero_grad();
  restore();
}

void LRFinder::restore() {
  if (!saved_ || !attached()) return;
  auto saved = std::move(*saved_);
  saved_.reset();
  restore_state(learn(), saved, {.with_opt = true}, "lr_find's saved state");
}

bool lr_finder_attached(const Learner& learn) { return learn.cb<LRFinder>() != nullptr; }

double valley(const std::vector<double>& lrs, const std::vector<double>& losses) {
  const std::size_t n = std::min(lrs.size(), losses.size());
  if (n == 0) throw Error("valley: no losses to suggest a learning rate from");
  // Longest decreasing subsequence ending at each point; the longest overall is the valley.
  std::vector<std::size_t> run(n, 1);
  std::size_t max_start = 0, max_end = 0;
  for (std::size_t i = 1; i < n; ++i) {
    for (std::size_t j = 0; j < i; ++j) {
      if (losses[i] < losses[j] && run[i] < run[j] + 1) run[i] = run[j] + 1;
      if (run[max_end] < run[i]) {
        max_end = i;
        max_start = max_end - run[max_end];
      }
    }
  }
  const double sections = static_cast<double>(max_end - max_start) / 3.0;
  const std::size_t idx = max_start + static_cast<std::size_t>(sections) + static_cast<std::size_t>(sections / 2);
  return lrs[std::min(idx, n - 1)];
}

}  // namespace fastlearn
