#pragma once
// Recorder: what happened during a fit. Per training batch: the smoothed loss (exponential moving
// average, beta 0.98, debiased) and the learning rate; per epoch: a row with the average training
// loss, the validation loss, each metric and the time. It writes loss and lr_find plots as SVG files.
// A batch's loss reaches the host through a HostReadback: on CUDA it is recorded one batch later, so the
// training loop never waits for the GPU to log (unless read_every_batch, which the LRFinder needs).
// In a data parallel job (Learner::Coordination::gather_items set) the validation loss and metrics are the whole
// set's, the same on every rank: when every metric keeps sums (Metric::additive_state, e.g. the segmentation metrics)
// each rank adds over its own items (the padding left out) and the sums are added over the ranks, the loss as the
// items' mean of the batch losses as on one process; otherwise the predictions of every rank are gathered once and the
// loss and metrics computed on the whole set.
#include <fastlearn/core/host_readback.h>
#include <fastlearn/learner/callback.h>
#include <fastlearn/learner/loss.h>
#include <fastlearn/learner/metrics.h>

#include <chrono>
#include <deque>
#include <exception>
#include <filesystem>
#include <limits>
#include <optional>
#include <string>
#include <vector>

namespace fastlearn {

struct EpochRecord {
  int epoch = 0;  ///< the fit's epoch plus its epoch_offset (fine_tune's unfrozen epochs follow the frozen ones)
  double train_loss = std::numeric_limits<double>::quiet_NaN();  ///< mean over the epoch's items
  double valid_loss = std::numeric_limits<double>::quiet_NaN();  ///< mean over the validation items
  std::vector<double> metrics;                                   ///< in the order of metric_names()
  double seconds = 0;
};

/// Debiased exponential moving average (fastai's smooth loss): after n values,
/// avg_n = beta * avg_{n-1} + (1 - beta) * x_n and value = avg_n / (1 - beta^n).
class SmoothValue {
 public:
  explicit SmoothValue(double beta = 0.98) : beta_(beta) {}
  void reset() { n_ = 0, avg_ = 0; }
  void add(double x);
  double value() const;
  std::int64_t count() const { return n_; }
  /// The biased running average (with count(), the whole state; for checkpoints).
  double average() const { return avg_; }
  /// Puts back a state read with count() and average().
  void restore(std::int64_t count, double average) { n_ = count, avg_ = average; }

 private:
  double beta_;
  std::int64_t n_ = 0;
  double avg_ = 0;
};

struct RecorderOptions {
  bool train_metrics = false;  ///< also compute the metrics over the training batches
  double beta = 0.98;          ///< smoothing of the training loss
};

class Recorder : public Callback {
 public:
  /// What a checkpoint taken inside a training epoch needs to continue the epoch's records exactly.
  struct EpochState {
    double loss_sum = 0;          ///< sum of loss * items over the epoch's batches so far
    std::int64_t loss_count = 0;  ///< items so far
    std::int64_t smooth_count = 0;
    double smooth_average = 0;
  };
  explicit Recorder(std::vector<MetricPtr> metrics, RecorderOptions options = {});
  std::string name() const override { return "recorder"; }

  void before_fit() override;
  void before_epoch() override;
  void before_train() override;
  void before_validate() override;
  void after_batch() override;
  void after_train() override;
  void after_validate() override;
  void after_epoch() override;

  /// Smoothed training loss after each training batch of the current (or last) fit.
  const std::vector<double>& losses() const { return losses_; }
  /// Learning rate of the last parameter group at each training batch.
  const std::vector<double>& lrs() const { return lrs_; }
  /// The loss of each training batch (unsmoothed), and the step (Learner::train_iter) it belongs to.
  const std::vector<double>& batch_losses() const { return raw_losses_; }
  const std::vector<std::int64_t>& steps() const { return steps_; }
  /// One row per finished epoch of the current (or last) fit.
  const std::vector<EpochRecord>& history() const { return history_; }
  /// Names of the metrics, in the order of EpochRecord::metrics (with "train_" prefixes if train_metrics).
  std::vector<std::string> metric_names() const;
  /// Column names of a row: epoch, train_loss, valid_loss, the metrics, time.
  std::vector<std::string> columns() const;
  /// The value called `name` ("train_loss", "valid_loss" or a metric) in `record`; Error if unknown.
  double value(const EpochRecord& record, const std::string& name) const;

  /// Validation loss and metrics of the last validation pass (NaN when it was cancelled or empty).
  double last_valid_loss() const { return valid_loss_; }
  const std::vector<double>& last_valid_metrics() const { return valid_values_; }

  /// Keep the raw predictions and targets of every validation pass (for get_preds; default: false).
  void keep_valid_preds(bool on) { keep_valid_preds_ = on; }
  /// The raw predictions (each output of the model) and targets (each of the batches') of the last validation pass,
  /// of the whole set in a data parallel job (empty unless keep_valid_preds; targets empty when the loader has none).
  const std::vector<at::Tensor>& last_valid_preds() const { return last_valid_preds_; }
  const std::vector<at::Tensor>& last_valid_targets() const { return last_valid_targets_; }

  /// The running epoch's accumulators (training loss and smoothed loss; training metrics are not included).
  EpochState epoch_state();
  /// Record every batch's loss at its own after_batch, waiting for the device if needed (default: false).
  void read_every_batch(bool on) { read_every_batch_ = on; }
  /// Continues an epoch from `state` (after before_train, when a fit resumes inside an epoch).
  void restore_epoch_state(const EpochState& state);

  /// Writes the smoothed training loss per batch (and validation loss per epoch) as an SVG plot.
  void plot_loss(const std::filesystem::path& file, std::size_t skip_start = 5) const;
  /// Writes smoothed loss against learning rate (log scale), marking `suggestion` if given.
  void plot_lr_find(const std::filesystem::path& file, std::size_t skip_end = 5,
                    std::optional<double> suggestion = {}) const;

 private:
  struct BatchNote {
    std::int64_t items = 0;
    std::int64_t step = 0;
    double lr = 0;
    bool training = false;
  };
  void record(double loss, const BatchNote& note);
  bool gathers() const;
  bool reduces() const;
  void reduce_validation();
  void validation_from(const std::vector<at::Tensor>& preds, const std::vector<at::Tensor>& targets);
  void record_pending(bool all);

  std::vector<MetricPtr> valid_metrics_;
  std::vector<MetricPtr> train_metrics_;
  HostReadback batch_losses_;  // losses on their way to the host, with the notes below
  std::deque<BatchNote> notes_;
  bool read_every_batch_ = false;
  RecorderOptions options_;
  SmoothValue smooth_;
  std::vector<double> losses_, lrs_, raw_losses_;
  std::vector<std::int64_t> steps_;
  std::vector<std::int64_t> epoch_end_iters_;  // training batches done at the end of each epoch, for plots
  std::vector<EpochRecord> history_;
  double loss_sum_ = 0;
  std::int64_t loss_count_ = 0;
  double train_loss_ = std::numeric_limits<double>::quiet_NaN();
  double valid_loss_ = std::numeric_limits<double>::quiet_NaN();
  std::vector<double> train_values_, valid_values_;
  bool keep_valid_preds_ = false;
  // This pass's batches, when kept or gathered: each batch's outputs (or targets).
  std::vector<std::vector<at::Tensor>> valid_preds_, valid_targets_;
  std::vector<std::int64_t> valid_items_;  // each kept batch's items
  bool reducing_ = false;                  // this validation pass adds sums over the ranks (reduces())
  std::int64_t own_items_ = -1;            // of this rank's items in the pass, those before the padding (-1: not asked)
  std::int64_t valid_items_seen_ = 0;      // this pass's items so far
  std::exception_ptr valid_failure_;       // a metric's error on this rank, thrown once every rank knows of it
  std::vector<at::Tensor> last_valid_preds_, last_valid_targets_;
  std::chrono::steady_clock::time_point epoch_start_;
};

}  // namespace fastlearn
