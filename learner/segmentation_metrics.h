#pragma once
// fastai's segmentation metrics, accumulated as sums over the pixels of every batch (never as stored predictions: a
// validation set of masks is large), so that a data parallel job gets the whole set's value by adding each rank's sums.
// Predictions are (N, C, H, W) scores, targets (N, H, W) class indices; a pixel's prediction is its argmax over C.
//   dice                2 * |P and T| / (|P| + |T|) of class 1 (two classes: fastai's Dice)
//   dice_multi          the mean over classes of each class's dice, classes absent from both left out (DiceMulti)
//   jaccard_coeff       |P and T| / |P or T| of class 1 (JaccardCoeff)
//   jaccard_coeff_multi the mean over classes of each class's IoU (JaccardCoeffMulti, "mIoU")
//   foreground_acc      the share of the non-background pixels whose prediction is right. fastai averages each batch's
//                       share weighted by the batch's item count, which depends on how pixels fall into batches;
//                       this is the pixel average (the same for one batch, and for any split into batches or ranks).
#include <fastlearn/learner/metrics.h>

#include <cstdint>
#include <string>

namespace fastlearn {

/// A metric of per-class pixel sums (a float64 tensor on the batches' device, added to by each batch): what a data
/// parallel job adds over its ranks before value().
class PixelSumsMetric : public Metric {
 public:
  void reset() override { sums_ = at::Tensor(); }
  void accumulate(const at::Tensor& pred, const at::Tensor& targ) override;
  double value() const override;
  at::Tensor* additive_state() override { return &sums_; }
  /// The sums so far (undefined before the first batch): rows of per-class counts, as batch_sums gives them.
  at::Tensor& sums() { return sums_; }

 protected:
  /// The sums of one batch of predicted classes `predicted` and targets `targ`, both (N, H, W) int64, for `classes`.
  virtual at::Tensor batch_sums(const at::Tensor& predicted, const at::Tensor& targ, std::int64_t classes) const = 0;
  /// The metric from the whole set's sums.
  virtual double value_of(const at::Tensor& sums) const = 0;

 private:
  at::Tensor sums_;
};

/// fastai's Dice (two classes, class 1 the foreground); "dice".
MetricPtr dice();
/// fastai's DiceMulti; "dice_multi".
MetricPtr dice_multi();
/// fastai's JaccardCoeff; "jaccard_coeff".
MetricPtr jaccard_coeff();
/// fastai's JaccardCoeffMulti; "jaccard_coeff_multi".
MetricPtr jaccard_coeff_multi();
/// The share of right predictions among the pixels whose target is not `background`; "foreground_acc".
MetricPtr foreground_acc(std::int64_t background = 0);

}  // namespace fastlearn
