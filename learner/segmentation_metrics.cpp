#include <fastlearn/learner/segmentation_metrics.h>

#include <fastlearn/core/error.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/torch.h>

#include <cmath>
#include <limits>
#include <memory>

namespace fastlearn {

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// Per class: row 0 the pixels predicted and true, row 1 the predicted ones plus the true ones (fastai's inter, union).
at::Tensor overlap_sums(const at::Tensor& predicted, const at::Tensor& targ, std::int64_t classes) {
  const auto p = predicted.flatten(), t = targ.flatten();
  const auto hits = at::bincount(p.masked_select(p.eq(t)), {}, classes);
  const auto both = at::bincount(p, {}, classes) + at::bincount(t, {}, classes);
  return torch::stack({hits, both}).to(torch::kFloat64);
}

// Which overlap the metric reports: dice 2i / u, IoU i / (u - i), for class 1 or averaged over the classes present.
enum class Overlap { dice, iou };

class OverlapMetric : public PixelSumsMetric {
 public:
  OverlapMetric(std::string name, Overlap overlap, bool multi)
      : name_(std::move(name)), overlap_(overlap), multi_(multi) {}
  std::string name() const override { return name_; }
  std::unique_ptr<Metric> clone() const override { return std::make_unique<OverlapMetric>(name_, overlap_, multi_); }

 protected:
  at::Tensor batch_sums(const at::Tensor& predicted, const at::Tensor& targ, std::int64_t classes) const override {
    if (!multi_ && classes != 2) {
      throw ConfigError(fmt::format("{}: predictions have {} classes; it takes two (use {}_multi)", name_, classes,
                                    overlap_ == Overlap::dice ? "dice" : "jaccard_coeff"));
    }
    return overlap_sums(predicted, targ, classes);
  }
  double value_of(const at::Tensor& sums) const override {
    const auto inter = sums[0], uni = sums[1];
    const auto per_class = overlap_ == Overlap::dice ? inter * 2 / uni : inter / (uni - inter);
    if (!multi_) return uni[1].item<double>() > 0 ? per_class[1].item<double>() : kNaN;
    const auto present = uni.gt(0);
    return present.any().item<bool>() ? per_class.masked_select(present).mean().item<double>() : kNaN;
  }

 private:
  std::string name_;
  Overlap overlap_;
  bool multi_;
};

class ForegroundAccuracy : public PixelSumsMetric {
 public:
  explicit ForegroundAccuracy(std::int64_t background) : background_(background) {}
  std::string name() const override { return "foreground_acc"; }
  std::unique_ptr<Metric> clone() const override { return std::make_unique<ForegroundAccuracy>(background_); }

 protected:
  at::Tensor batch_sums(const at::Tensor& predicted, const at::Tensor& targ, std::int64_t) const override {
    const auto foreground = targ.ne(background_);
    return torch::stack({predicted.eq(targ).logical_and(foreground).sum(), foreground.sum()}).to(torch::kFloat64);
  }
  double value_of(const at::Tensor& sums) const override {
    const auto total = sums[1].item<double>();
    return total > 0 ? sums[0].item<double>() / total : kNaN;
  }

 private:
  std::int64_t background_;
};

}  // namespace

void PixelSumsMetric::accumulate(const at::Tensor& pred, const at::Tensor& targ) {
  if (pred.dim() < 2 || targ.dim() != pred.dim() - 1 || targ.size(0) != pred.size(0) ||
      targ.sizes().slice(1) != pred.sizes().slice(2)) {
    throw DataError(
        fmt::format("{}: predictions [{}] and targets [{}]: expects (N, C, H, W) scores and (N, H, W) "
                    "class indices",
                    name(), fmt::join(pred.sizes(), ", "), fmt::join(targ.sizes(), ", ")));
  }
  const auto classes = pred.size(1);
  const auto t = targ.to(torch::kLong);
  if (t.numel() > 0 && (t.min().item<std::int64_t>() < 0 || t.max().item<std::int64_t>() >= classes)) {
    throw DataError(fmt::format("{}: a target class is outside [0, {})", name(), classes));
  }
  auto batch = batch_sums(pred.detach().argmax(1), t, classes);
  sums_ = sums_.defined() ? sums_ + batch : batch;
}

double PixelSumsMetric::value() const { return sums_.defined() ? value_of(sums_.cpu()) : kNaN; }

MetricPtr dice() { return std::make_shared<OverlapMetric>("dice", Overlap::dice, false); }
MetricPtr dice_multi() { return std::make_shared<OverlapMetric>("dice_multi", Overlap::dice, true); }
MetricPtr jaccard_coeff() { return std::make_shared<OverlapMetric>("jaccard_coeff", Overlap::iou, false); }
MetricPtr jaccard_coeff_multi() { return std::make_shared<OverlapMetric>("jaccard_coeff_multi", Overlap::iou, true); }
MetricPtr foreground_acc(std::int64_t background) { return std::make_shared<ForegroundAccuracy>(background); }

}  // namespace fastlearn
