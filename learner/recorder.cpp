#include <fastlearn/learner/recorder.h>

#include <fastlearn/core/detail/svg_plot.h>
#include <fastlearn/core/detail/text.h>
#include <fastlearn/core/error.h>
#include <fastlearn/learner/callback_order.h>
#include <fastlearn/learner/learner.h>

#include <fmt/format.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <utility>

namespace fastlearn {

void SmoothValue::add(double x) {
  ++n_;
  avg_ = beta_ * avg_ + (1.0 - beta_) * x;
}

double SmoothValue::value() const {
  if (n_ == 0) return std::numeric_limits<double>::quiet_NaN();
  return avg_ / (1.0 - std::pow(beta_, static_cast<double>(n_)));
}

namespace {

std::vector<MetricPtr> fresh_copies(const std::vector<MetricPtr>& metrics) {
  std::vector<MetricPtr> copies;
  for (const auto& m : metrics) copies.push_back(m->clone());
  return copies;
}

std::vector<at::Tensor> detached(std::vector<at::Tensor> tensors) {
  for (auto& t : tensors) t = t.detach();
  return tensors;
}

// The first `rows` items of each of a batch's tensors of `items` items (one that is not per item stays whole).
void first_rows(std::vector<at::Tensor>& tensors, std::int64_t items, std::int64_t rows) {
  for (auto& t : tensors) {
    if (t.defined() && t.dim() > 0 && t.size(0) == items) t = t.narrow(0, 0, rows);
  }
}

// Each output (or target) of the batches, concatenated over the batches when it holds a row per item of each batch
// (`items`); one that does not (a scalar, a state of another shape) is the first batch's, and not per item.
struct Columns {
  std::vector<at::Tensor> tensors;
  std::vector<bool> per_item;
};
Columns concatenated(const std::vector<std::vector<at::Tensor>>& batches, const std::vector<std::int64_t>& items) {
  Columns out;
  if (batches.empty()) return out;
  for (std::size_t k = 0; k < batches[0].size(); ++k) {
    std::vector<at::Tensor> column;
    bool per_item = true;
    for (std::size_t b = 0; b < batches.size(); ++b) {
      const auto& t = k < batches[b].size() ? batches[b][k] : at::Tensor();
      per_item = per_item && t.defined() && t.dim() > 0 && t.size(0) == items[b];
      column.push_back(t);
    }
    out.tensors.push_back(per_item ? at::cat(column) : column.front());
    out.per_item.push_back(per_item);
  }
  return out;
}

std::vector<double> values_of(const std::vector<MetricPtr>& metrics) {
  std::vector<double> values;
  for (const auto& m : metrics) values.push_back(m->value());
  return values;
}

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

}  // namespace

Recorder::Recorder(std::vector<MetricPtr> metrics, RecorderOptions options)
    : valid_metrics_(fresh_copies(metrics)),
      train_metrics_(options.train_metrics ? fresh_copies(metrics) : std::vector<MetricPtr>{}),
      options_(options),
      smooth_(options.beta) {
  order = cb_order::recorder;
}

std::vector<std::string> Recorder::metric_names() const {
  std::vector<std::string> names;
  for (const auto& m : train_metrics_) names.push_back("train_" + m->name());
  for (const auto& m : valid_metrics_) names.push_back(options_.train_metrics ? "valid_" + m->name() : m->name());
  return names;
}

std::vector<std::string> Recorder::columns() const {
  std::vector<std::string> cols{"epoch", "train_loss", "valid_loss"};
  for (auto& n : metric_names()) cols.push_back(std::move(n));
  cols.push_back("time");
  return cols;
}

double Recorder::value(const EpochRecord& record, const std::string& name) const {
  if (name == "train_loss") return record.train_loss;
  if (name == "valid_loss") return record.valid_loss;
  const auto names = metric_names();
  for (std::size_t i = 0; i < names.size() && i < record.metrics.size(); ++i) {
    if (names[i] == name) return record.metrics[i];
  }
  std::string known = "train_loss, valid_loss";
  for (const auto& n : names) known.append(", ").append(n);
  throw Error("Recorder: no value called '" + excerpt(name) + "'; the recorded values are: " + known);
}

void Recorder::before_fit() {
  smooth_.reset();
  learn().smooth_loss = kNaN;  // no value until this fit's first batch
  losses_.clear();
  lrs_.clear();
  raw_losses_.clear();
  steps_.clear();
  epoch_end_iters_.clear();
  history_.clear();
}

void Recorder::before_epoch() {
  epoch_start_ = std::chrono::steady_clock::now();
  train_loss_ = valid_loss_ = kNaN;
  train_values_.assign(train_metrics_.size(), kNaN);
  valid_values_.assign(valid_metrics_.size(), kNaN);
}

void Recorder::before_train() {
  batch_losses_.clear();
  notes_.clear();
  loss_sum_ = 0;
  loss_count_ = 0;
  for (auto& m : train_metrics_) m->reset();
}

void Recorder::before_validate() {
  batch_losses_.clear();
  notes_.clear();
  loss_sum_ = 0;
  loss_count_ = 0;
  for (auto& m : valid_metrics_) m->reset();
  valid_values_.assign(valid_metrics_.size(), kNaN);
  valid_preds_.clear();
  valid_targets_.clear();
  valid_items_.clear();
  last_valid_preds_.clear();
  last_valid_targets_.clear();
  reducing_ = reduces();
  valid_failure_ = nullptr;
  own_items_ = -1;  // asked at the first batch: the data parallel trainer wraps the loader after this callback
  valid_items_seen_ = 0;
}

bool Recorder::gathers() const { return static_cast<bool>(learn().coordination().gather_items); }

bool Recorder::reduces() const {
  const auto& c = learn().coordination();
  if (!gathers() || keep_valid_preds_ || !c.own_items || !c.reduce_over_processes) return false;
  return std::all_of(valid_metrics_.begin(), valid_metrics_.end(), [](const auto& m) { return m->additive_state(); });
}

void Recorder::after_batch() {
  auto& l = learn();
  if (!l.training && reducing_ && own_items_ < 0) {  // the pass's first batch: the trainer has wrapped its loader
    const auto own = l.coordination().own_items();
    reducing_ = own.has_value();  // items that are not shared out are gathered as before (no collective: each its own)
    own_items_ = own.value_or(0);
  }
  const bool collect = !l.training && l.pred.defined() && (keep_valid_preds_ || (gathers() && !reducing_));
  if (collect) {
    valid_preds_.push_back(detached(l.all_preds()));
    if (!l.yb.empty()) valid_targets_.push_back(detached(l.yb));
    valid_items_.push_back(!l.yb.empty() ? find_bs(l.yb) : (l.pred.dim() > 0 ? l.pred.size(0) : 1));
  }
  if (l.yb.empty() || !l.loss.defined()) return;
  auto preds = l.all_preds();
  auto targs = l.yb;
  auto loss = l.loss.detach().mean();  // the mean also for a loss without reduction
  auto items = find_bs(l.yb);
  if (!l.training && reducing_) {  // this rank's own items only: the padding at the end of its share is left out
    const auto own = std::clamp<std::int64_t>(own_items_ - valid_items_seen_, 0, items);
    valid_items_seen_ += items;
    if (own < items) {
      first_rows(preds, items, own);
      first_rows(targs, items, own);
      if (own > 0) loss = l.loss_func()(preds, targs).detach().mean();
      items = own;
    }
  }
  // Gathered validation metrics are computed once, on the whole set, at after_validate. Reduced ones may fail on one
  // rank alone: the error waits for after_validate, where every rank learns of it before the sums are added.
  if (l.training || !gathers()) {
    for (auto& m : l.training ? train_metrics_ : valid_metrics_) m->accumulate_all(preds, targs);
  } else if (reducing_ && !valid_failure_) {
    try {
      for (auto& m : valid_metrics_) m->accumulate_all(preds, targs);
    } catch (...) {
      valid_failure_ = std::current_exception();
    }
  }
  if (items == 0) return;
  batch_losses_.push(loss);
  notes_.push_back({.items = items,
                    .step = l.train_iter,
                    .lr = l.training && l.has_opt() ? l.opt().hyper("lr", l.opt().n_groups() - 1) : kNaN,
                    .training = l.training});
  record_pending(read_every_batch_);
}

void Recorder::record_pending(bool all) {
  for (double loss : all ? batch_losses_.take_all() : batch_losses_.take_ready()) {
    record(loss, notes_.front());
    notes_.pop_front();
  }
}

void Recorder::record(double loss, const BatchNote& note) {
  loss_sum_ += loss * static_cast<double>(note.items);
  loss_count_ += note.items;
  if (!note.training) return;
  smooth_.add(loss);
  learn().smooth_loss = smooth_.value();
  losses_.push_back(smooth_.value());
  lrs_.push_back(note.lr);
  raw_losses_.push_back(loss);
  steps_.push_back(note.step);
}

Recorder::EpochState Recorder::epoch_state() {
  record_pending(true);
  return {.loss_sum = loss_sum_,
          .loss_count = loss_count_,
          .smooth_count = smooth_.count(),
          .smooth_average = smooth_.average()};
}

void Recorder::restore_epoch_state(const EpochState& state) {
  batch_losses_.clear();
  notes_.clear();
  loss_sum_ = state.loss_sum;
  loss_count_ = state.loss_count;
  smooth_.restore(state.smooth_count, state.smooth_average);
}

void Recorder::after_train() {
  record_pending(true);
  train_loss_ = loss_count_ ? loss_sum_ / static_cast<double>(loss_count_) : kNaN;
  train_values_ = values_of(train_metrics_);
}

void Recorder::after_validate() {
  record_pending(true);
  if (reducing_ && own_items_ >= 0) reduce_validation();  // a pass without batches has none on every rank
  valid_loss_ = loss_count_ ? loss_sum_ / static_cast<double>(loss_count_) : kNaN;
  if (!gathers() || reducing_) valid_values_ = values_of(valid_metrics_);
  if (valid_preds_.empty()) return;
  auto [preds, preds_per_item] = concatenated(valid_preds_, valid_items_);
  auto [targets, targets_per_item] = concatenated(valid_targets_, valid_items_);
  valid_preds_.clear();
  valid_targets_.clear();
  valid_items_.clear();
  if (gathers()) {  // every rank's share, in dataset order, padding removed
    const auto& gather = learn().coordination().gather_items;
    for (std::size_t k = 0; k < preds.size(); ++k)
      if (preds_per_item[k]) preds[k] = gather(preds[k]);
    for (std::size_t k = 0; k < targets.size(); ++k)
      if (targets_per_item[k]) targets[k] = gather(targets[k]);
    if (!targets.empty()) validation_from(preds, targets);
  }
  if (keep_valid_preds_) {
    last_valid_preds_ = preds;
    last_valid_targets_ = targets;
  }
}

// Collective: every rank has run the same batches, so every rank's sums have the same shapes (a rank whose batches were
// padding only accumulated empty batches, zeros), and the loss's (sum, items) travel together.
void Recorder::reduce_validation() {
  const auto& c = learn().coordination();
  const bool failed = static_cast<bool>(valid_failure_);
  if (c.any_process ? c.any_process(failed) : failed) {
    auto mine = std::exchange(valid_failure_, nullptr);
    if (mine) std::rethrow_exception(mine);
    throw DistributedError("validation: a metric failed on another rank (its error is in that rank's output)");
  }
  const auto& reduce = c.reduce_over_processes;
  auto loss = torch::tensor({loss_sum_, static_cast<double>(loss_count_)}, torch::kFloat64);
  reduce(loss, false);
  loss_sum_ = loss[0].item<double>();
  loss_count_ = static_cast<std::int64_t>(loss[1].item<double>());
  for (auto& m : valid_metrics_) {
    auto& sums = *m->additive_state();
    if (sums.defined()) reduce(sums, false);
  }
}

void Recorder::validation_from(const std::vector<at::Tensor>& preds, const std::vector<at::Tensor>& targets) {
  if (preds[0].size(0) == 0) {
    valid_loss_ = kNaN;
    valid_values_.assign(valid_metrics_.size(), kNaN);
    return;
  }
  valid_loss_ = learn().loss_func()(preds, targets).mean().item<double>();
  for (auto& m : valid_metrics_) {
    m->reset();
    m->accumulate_all(preds, targets);
  }
  valid_values_ = values_of(valid_metrics_);
}

void Recorder::after_epoch() {
  EpochRecord record{
      .epoch = learn().epoch_offset + learn().epoch, .train_loss = train_loss_, .valid_loss = valid_loss_};
  record.metrics = train_values_;
  record.metrics.insert(record.metrics.end(), valid_values_.begin(), valid_values_.end());
  record.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - epoch_start_).count();
  history_.push_back(std::move(record));
  epoch_end_iters_.push_back(static_cast<std::int64_t>(losses_.size()));
}

void Recorder::plot_loss(const std::filesystem::path& file, std::size_t skip_start) const {
  PlotSeries train{.label = "train (smoothed)"};
  for (std::size_t i = skip_start; i < losses_.size(); ++i) {
    train.x.push_back(static_cast<double>(i));
    train.y.push_back(losses_[i]);
  }
  PlotSeries valid{.label = "valid", .markers = false};
  for (std::size_t e = 0; e < history_.size() && e < epoch_end_iters_.size(); ++e) {
    valid.x.push_back(static_cast<double>(epoch_end_iters_[e]));
    valid.y.push_back(history_[e].valid_loss);
  }
  write_svg_plot(file, {train, valid}, {.title = "Loss", .xlabel = "training batches", .ylabel = "loss"});
}

void Recorder::plot_lr_find(const std::filesystem::path& file, std::size_t skip_end,
                            std::optional<double> suggestion) const {
  const std::size_t n = losses_.size() > skip_end ? losses_.size() - skip_end : 0;
  PlotSeries curve{.x = {lrs_.begin(), lrs_.begin() + static_cast<std::ptrdiff_t>(n)},
                   .y = {losses_.begin(), losses_.begin() + static_cast<std::ptrdiff_t>(n)}};
  std::vector<PlotSeries> series{curve};
  if (suggestion) {
    // Mark the suggestion on the curve at the nearest recorded lr.
    std::size_t best = 0;
    for (std::size_t i = 0; i < n; ++i) {
      if (std::abs(std::log(lrs_[i] / *suggestion)) < std::abs(std::log(lrs_[best] / *suggestion))) best = i;
    }
    if (n > 0) {
      series.push_back({.label = fmt::format("valley {:.2e}", *suggestion),
                        .x = {*suggestion},
                        .y = {losses_[best]},
                        .markers = true});
    }
  }
  write_svg_plot(file, series,
                 {.title = "Learning rate finder", .xlabel = "learning rate", .ylabel = "loss", .log_x = true});
}

}  // namespace fastlearn
