#include <fastlearn/learner/lr_finder.h>

#include <fastlearn/core/error.h>
#include <fastlearn/learner/learner.h>
#include <fastlearn/learner/recorder.h>

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>

namespace fastlearn {

LRFinder::LRFinder(LrFindOptions options)
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

void LRFinder::after_loss() {
  auto& l = learn();
  const auto& gather = l.coordination().all_gather_rows;  // set only when ranks train together
  if (gather && l.training) l.loss = gather(l.loss.detach().mean().reshape({1})).mean();
}

CaptureSupport LRFinder::step_capture() const {
  if (!learn().coordination().all_gather_rows) return {.kind = StepCapture::capturable, .why = {}};
  return {.kind = StepCapture::eager_only, .why = "in a job of several processes it gathers each batch's loss"};
}

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

namespace {

std::size_t checked_size(const std::vector<double>& lrs, const std::vector<double>& losses, const char* rule) {
  const std::size_t n = std::min(lrs.size(), losses.size());
  if (n == 0) throw Error(fmt::format("{}: no losses to suggest a learning rate from", rule));
  return n;
}

}  // namespace

double valley(const std::vector<double>& lrs, const std::vector<double>& losses) {
  const std::size_t n = checked_size(lrs, losses, "valley");
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

double slide(const std::vector<double>& lrs, const std::vector<double>& losses, int lr_diff, double thresh) {
  const auto n = static_cast<std::int64_t>(checked_size(lrs, losses, "slide"));
  // The loss gradient per point: central differences inside, one-sided at both ends (numpy.gradient).
  std::vector<double> grad(static_cast<std::size_t>(n), 0.0);
  for (std::int64_t i = 0; i < n && n > 1; ++i) {
    const auto lo = static_cast<std::size_t>(std::max<std::int64_t>(i - 1, 0));
    const auto hi = static_cast<std::size_t>(std::min<std::int64_t>(i + 1, n - 1));
    grad[static_cast<std::size_t>(i)] = (losses[hi] - losses[lo]) / static_cast<double>(hi - lo);
  }
  std::int64_t right = n - 1, left = right - lr_diff;
  double suggestion = lrs[static_cast<std::size_t>(std::max<std::int64_t>(left, 0))];
  for (; left >= 0; --left, --right) {
    if (std::abs(grad[static_cast<std::size_t>(right)] - grad[static_cast<std::size_t>(left)]) <= thresh) break;
    suggestion = lrs[static_cast<std::size_t>(left)];
  }
  return suggestion;
}

double minimum(const std::vector<double>& lrs, const std::vector<double>& losses) {
  const std::size_t n = checked_size(lrs, losses, "minimum");
  const auto lowest = std::min_element(losses.begin(), losses.begin() + static_cast<std::ptrdiff_t>(n));
  return lrs[static_cast<std::size_t>(lowest - losses.begin())] / 10;
}

double steep(const std::vector<double>& lrs, const std::vector<double>& losses) {
  const std::size_t n = checked_size(lrs, losses, "steep");
  std::size_t best = 0;
  double steepest = std::numeric_limits<double>::infinity();
  for (std::size_t i = 0; i + 1 < n; ++i) {
    const double slope = (losses[i + 1] - losses[i]) / (std::log(lrs[i + 1]) - std::log(lrs[i]));
    if (slope < steepest) steepest = slope, best = i;
  }
  return lrs[best];
}

LrFindResult Learner::lr_find(LrFindOptions options) {
  const auto batches = dls_.train().size();
  if (batches == 0) throw Error("lr_find: the training loader has no batch");
  auto finder = std::make_shared<LRFinder>(options);
  const int epochs = static_cast<int>(finder->num_it() / batches) + 1;
  const int epochs_completed = epochs_completed_;  // a loaded checkpoint's resume point survives lr_find
  try {
    fit(epochs, {}, {.cbs = {finder}});
  } catch (...) {
    finder->restore();  // also when the sweep dies of an error, not only when it is cancelled
    epochs_completed_ = epochs_completed;
    throw;
  }
  epochs_completed_ = epochs_completed;

  const auto& rec = recorder();
  LrFindResult result;
  // As fastai: skip the first tenth of the iterations and the last five, and stop at the first NaN.
  const auto& lrs = rec.lrs();
  const auto& losses = rec.losses();
  const std::size_t begin = static_cast<std::size_t>(finder->num_it() / 10);
  const std::size_t end = losses.size() > 5 ? losses.size() - 5 : 0;
  for (std::size_t i = begin; i < end && !std::isnan(losses[i]); ++i) {
    result.lrs.push_back(lrs[i]);
    result.losses.push_back(losses[i]);
  }
  if (result.lrs.empty()) {
    throw Error(fmt::format("lr_find: only {} iterations ran, too few for a suggestion; raise num_it or end_lr",
                            losses.size()));
  }
  result.valley = valley(result.lrs, result.losses);
  result.slide = slide(result.lrs, result.losses);
  result.minimum = minimum(result.lrs, result.losses);
  result.steep = steep(result.lrs, result.losses);
  if (options.plot) rec.plot_lr_find(*options.plot, 5, result.valley);
  return result;
}

}  // namespace fastlearn
