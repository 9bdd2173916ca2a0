#pragma once
// Metrics, as fastai's metrics.py: each accumulates over the batches of an epoch (reset, accumulate per
// batch, value at the end). AvgMetric averages a per-batch value weighted by batch size; AccumMetric keeps
// the predictions and targets and computes its function over the whole set. Inputs are detached: a
// metric never keeps the autograd graph alive.
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace fastlearn {

class Metric {
 public:
  virtual ~Metric() = default;
  virtual std::string name() const = 0;
  virtual void reset() = 0;
  /// One batch: the model's raw output and the batch's target.
  virtual void accumulate(const at::Tensor& pred, const at::Tensor& targ) = 0;
  /// One batch with every output of the model (Learner::pred, then extra_preds) and every target (Learner::yb): the
  /// Recorder calls this; by default it is accumulate() of the first of each (metric_on picks others).
  virtual void accumulate_all(const std::vector<at::Tensor>& preds, const std::vector<at::Tensor>& targs);
  /// The value over everything accumulated since reset(); NaN when nothing was accumulated.
  virtual double value() const = 0;
  /// A fresh, reset copy with the same configuration.
  virtual std::unique_ptr<Metric> clone() const = 0;
  /// The metric's state when it is a tensor of sums (the sum over disjoint parts of a set is the whole set's state),
  /// which a data parallel job adds over its processes instead of gathering every prediction; null when the metric
  /// needs the predictions themselves. Undefined before the first batch.
  virtual at::Tensor* additive_state() { return nullptr; }
};

using MetricPtr = std::shared_ptr<Metric>;

/// Average of a per-batch value weighted by batch size (pred.size(0)). The running total stays a tensor on
/// the batch's device, so accumulate() never synchronizes a GPU; value() does, once.
class AvgMetric : public Metric {
 public:
  /// fn(pred, targ) returns the batch's mean as a one-element tensor.
  using Fn = std::function<at::Tensor(const at::Tensor& pred, const at::Tensor& targ)>;
  /// `finalize`, when set, maps the weighted average to the reported value (sqrt for rmse).
  AvgMetric(std::string name, Fn fn, std::function<double(double)> finalize = nullptr);

  std::string name() const override { return name_; }
  void reset() override;
  void accumulate(const at::Tensor& pred, const at::Tensor& targ) override;
  double value() const override;
  std::unique_ptr<Metric> clone() const override;

 private:
  std::string name_;
  Fn fn_;
  std::function<double(double)> finalize_;
  at::Tensor total_;  ///< sum over batches of value * batch size, float64, on the batches' device
  std::int64_t count_ = 0;
};

/// Keeps every batch's (detached) predictions and targets, on their device, and computes fn over the whole
/// set (concatenated along dim 0) at value().
class AccumMetric : public Metric {
 public:
  using Fn = std::function<double(const at::Tensor& preds, const at::Tensor& targs)>;
  using Activation = std::function<at::Tensor(const at::Tensor& pred)>;
  /// `activation`, when set, is applied to each batch's predictions as they come (e.g. an argmax), so only
  /// what fn needs is kept.
  AccumMetric(std::string name, Fn fn, Activation activation = nullptr);

  std::string name() const override { return name_; }
  void reset() override;
  void accumulate(const at::Tensor& pred, const at::Tensor& targ) override;
  double value() const override;
  std::unique_ptr<Metric> clone() const override;

 private:
  std::string name_;
  Fn fn_;
  Activation activation_;
  std::vector<at::Tensor> preds_, targs_;
};

/// Fraction of items whose argmax over the last dim equals the target; "accuracy".
MetricPtr accuracy();
/// 1 - accuracy; "error_rate".
MetricPtr error_rate();
/// Fraction of items whose target is among the k highest scores; "top_k_accuracy". k must be >= 1.
MetricPtr top_k_accuracy(int k = 5);
/// Macro F1 over the classes present in the predictions (argmax) or the targets, over the whole set;
/// "f1_macro". A class's F1 is 2*TP / (2*TP + FP + FN); precision or recall with a zero denominator count
/// as 0 (sklearn's zero_division=0), so a class never predicted, or predicted but absent, scores 0.
MetricPtr f1_macro();
/// Mean squared error; "mse".
MetricPtr mse();
/// Mean absolute error; "mae".
MetricPtr mae();
/// Root of the whole-set mean squared error (not an average of per-batch roots); "rmse".
MetricPtr rmse();

/// `metric` on output `output` of the model (0: Learner::pred) against target `target` of the batch, for models of
/// several outputs; named `name`, by default the metric's own name and the output ("mse_1"). An Error names both when
/// a batch has fewer.
MetricPtr metric_on(MetricPtr metric, std::size_t output, std::size_t target, std::string name = "");

}  // namespace fastlearn
