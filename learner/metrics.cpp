#include <fastlearn/learner/metrics.h>

#include <fastlearn/core/error.h>
#include <fmt/format.h>
#include <torch/torch.h>

#include <cmath>
#include <limits>

namespace fastlearn {

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// pred and targ flattened, after checking that they hold the same number of items (fastai's flatten_check).
std::pair<at::Tensor, at::Tensor> flatten_check(const char* metric, const at::Tensor& pred, const at::Tensor& targ) {
  if (pred.numel() != targ.numel())
    throw ConfigError(
        fmt::format("{}: the predictions hold {} values but the targets {}; the metric does not fit "
                    "the model's output",
                    metric, pred.numel(), targ.numel()));
  return {pred.flatten(), targ.flatten()};
}

// Regression metrics compute in at least float32, whatever the model's dtype.
at::ScalarType regression_dtype(const at::Tensor& pred) { return at::promote_types(pred.scalar_type(), at::kFloat); }

AvgMetric::Fn squared_error(const char* metric) {
  return [metric](const at::Tensor& pred, const at::Tensor& targ) {
    const auto [p, t] = flatten_check(metric, pred, targ);
    const auto dtype = regression_dtype(p);
    return (p.to(dtype) - t.to(dtype)).square().mean();
  };
}

at::Tensor batch_accuracy(const at::Tensor& pred, const at::Tensor& targ) {
  const auto [p, t] = flatten_check("accuracy", pred.argmax(-1), targ);
  return p.eq(t).to(at::kDouble).mean();
}

// A metric on one of several outputs and targets.
class MetricOn : public Metric {
 public:
  MetricOn(MetricPtr inner, std::size_t output, std::size_t target, std::string name)
      : inner_(std::move(inner)), output_(output), target_(target), name_(std::move(name)) {}
  std::string name() const override { return name_; }
  void reset() override { inner_->reset(); }
  void accumulate(const at::Tensor& pred, const at::Tensor& targ) override { accumulate_all({pred}, {targ}); }
  void accumulate_all(const std::vector<at::Tensor>& preds, const std::vector<at::Tensor>& targs) override {
    if (output_ >= preds.size() || target_ >= targs.size()) {
      throw ConfigError(
          fmt::format("metric '{}' reads output {} and target {}, and the batch has {} output(s) and {} "
                      "target(s)",
                      name_, output_, target_, preds.size(), targs.size()));
    }
    inner_->accumulate(preds[output_], targs[target_]);
  }
  double value() const override { return inner_->value(); }
  std::unique_ptr<Metric> clone() const override {
    return std::make_unique<MetricOn>(MetricPtr(inner_->clone()), output_, target_, name_);
  }
  at::Tensor* additive_state() override { return inner_->additive_state(); }

 private:
  MetricPtr inner_;
  std::size_t output_, target_;
  std::string name_;
};

}  // namespace

void Metric::accumulate_all(const std::vector<at::Tensor>& preds, const std::vector<at::Tensor>& targs) {
  if (preds.empty() || targs.empty()) {
    throw ConfigError(fmt::format("metric '{}': the batch has {} output(s) and {} target(s); it reads one of each",
                                  name(), preds.size(), targs.size()));
  }
  accumulate(preds[0], targs[0]);
}

MetricPtr metric_on(MetricPtr metric, std::size_t output, std::size_t target, std::string name) {
  if (!metric) throw ConfigError("metric_on: the metric is null");
  if (name.empty()) name = output == 0 && target == 0 ? metric->name() : fmt::format("{}_{}", metric->name(), output);
  return std::make_shared<MetricOn>(std::move(metric), output, target, std::move(name));
}

// ---------------------------------------------------------------------------------------------------------------
// AvgMetric

AvgMetric::AvgMetric(std::string name, Fn fn, std::function<double(double)> finalize)
    : name_(std::move(name)), fn_(std::move(fn)), finalize_(std::move(finalize)) {
  if (!fn_) throw ConfigError(fmt::format("AvgMetric '{}': no function given", name_));
}

void AvgMetric::reset() {
  total_ = at::Tensor();
  count_ = 0;
}

void AvgMetric::accumulate(const at::Tensor& pred, const at::Tensor& targ) {
  at::NoGradGuard no_grad;
  if (pred.dim() == 0)
    throw ConfigError(fmt::format("{}: the predictions are a scalar; a metric needs a batch dimension first", name_));
  const auto bs = pred.size(0);
  if (bs == 0) return;  // an empty batch would add a NaN mean
  const auto v = fn_(pred.detach(), targ.detach()).detach();
  if (v.numel() != 1)
    throw ConfigError(
        fmt::format("{}: the metric function returned {} values; it must return the batch's mean as "
                    "one value",
                    name_, v.numel()));
  const auto weighted = v.reshape({}).to(at::kDouble) * static_cast<double>(bs);
  total_ = total_.defined() ? total_ + weighted.to(total_.device()) : weighted;
  count_ += bs;
}

double AvgMetric::value() const {
  if (count_ == 0) return kNaN;
  const double avg = total_.item<double>() / static_cast<double>(count_);
  return finalize_ ? finalize_(avg) : avg;
}

std::unique_ptr<Metric> AvgMetric::clone() const { return std::make_unique<AvgMetric>(name_, fn_, finalize_); }

// ---------------------------------------------------------------------------------------------------------------
// AccumMetric

AccumMetric::AccumMetric(std::string name, Fn fn, Activation activation)
    : name_(std::move(name)), fn_(std::move(fn)), activation_(std::move(activation)) {
  if (!fn_) throw ConfigError(fmt::format("AccumMetric '{}': no function given", name_));
}

void AccumMetric::reset() {
  preds_.clear();
  targs_.clear();
}

void AccumMetric::accumulate(const at::Tensor& pred, const at::Tensor& targ) {
  at::NoGradGuard no_grad;
  auto p = pred.detach();
  preds_.push_back(activation_ ? activation_(p).detach() : p);
  targs_.push_back(targ.detach());
}

double AccumMetric::value() const {
  if (preds_.empty()) return kNaN;
  at::NoGradGuard no_grad;
  return fn_(at::cat(preds_), at::cat(targs_));
}

std::unique_ptr<Metric> AccumMetric::clone() const { return std::make_unique<AccumMetric>(name_, fn_, activation_); }

// ---------------------------------------------------------------------------------------------------------------
// Ready-made metrics

MetricPtr accuracy() { return std::make_shared<AvgMetric>("accuracy", batch_accuracy); }

MetricPtr error_rate() {
  return std::make_shared<AvgMetric>(
      "error_rate", [](const at::Tensor& pred, const at::Tensor& targ) { return 1 - batch_accuracy(pred, targ); });
}

MetricPtr top_k_accuracy(int k) {
  if (k < 1) throw ConfigError(fmt::format("top_k_accuracy: k must be >= 1, got {}", k));
  return std::make_shared<AvgMetric>("top_k_accuracy", [k](const at::Tensor& pred, const at::Tensor& targ) {
    if (pred.dim() < 1 || pred.size(-1) < k)
      throw ConfigError(fmt::format("top_k_accuracy: k = {} but the predictions have only {} classes; use a smaller k",
                                    k, pred.dim() < 1 ? 0 : pred.size(-1)));
    const auto top = std::get<1>(pred.topk(k, -1));  // (..., k) class indices
    const auto items = top.numel() / k;
    if (targ.numel() != items)
      throw ConfigError(
          fmt::format("top_k_accuracy: the predictions hold {} items but the targets {}; the metric "
                      "does not fit the model's output",
                      items, targ.numel()));
    const auto hits = top.reshape({items, k}).eq(targ.reshape({items, 1})).any(-1);
    return hits.to(at::kDouble).mean();
  });
}

MetricPtr f1_macro() {
  auto fn = [](const at::Tensor& preds, const at::Tensor& targs) {
    const auto [pf, tf] = flatten_check("f1_macro", preds, targs);
    const auto p = pf.to(at::kCPU, at::kLong), t = tf.to(at::kCPU, at::kLong);
    if (p.numel() == 0) return kNaN;
    const auto lowest = std::min(p.min().item<std::int64_t>(), t.min().item<std::int64_t>());
    if (lowest < 0)
      throw ConfigError(
          fmt::format("f1_macro: class index {} is negative; drop ignored items (e.g. -100) first", lowest));
    const auto n = std::max(p.max().item<std::int64_t>(), t.max().item<std::int64_t>()) + 1;
    const auto tp = at::bincount(t.masked_select(p.eq(t)), {}, n).to(at::kDouble);
    // 2*TP + FP + FN = (items predicted as c) + (items of class c); > 0 exactly for the classes present.
    const auto present = (at::bincount(p, {}, n) + at::bincount(t, {}, n)).to(at::kDouble);
    const auto mask = present.gt(0);
    return (2 * tp.masked_select(mask) / present.masked_select(mask)).mean().item<double>();
  };
  auto argmax = [](const at::Tensor& pred) { return pred.argmax(-1); };
  return std::make_shared<AccumMetric>("f1_macro", fn, argmax);
}

MetricPtr mse() { return std::make_shared<AvgMetric>("mse", squared_error("mse")); }

MetricPtr mae() {
  return std::make_shared<AvgMetric>("mae", [](const at::Tensor& pred, const at::Tensor& targ) {
    const auto [p, t] = flatten_check("mae", pred, targ);
    const auto dtype = regression_dtype(p);
    return (p.to(dtype) - t.to(dtype)).abs().mean();
  });
}

MetricPtr rmse() {
  // The batch-size-weighted mean of per-batch MSEs is the whole-set MSE (items of equal size), so its root
  // is the whole-set RMSE without keeping the predictions.
  return std::make_shared<AvgMetric>("rmse", squared_error("rmse"),
                                     [](double mse_value) { return std::sqrt(mse_value); });
}

}  // namespace fastlearn
