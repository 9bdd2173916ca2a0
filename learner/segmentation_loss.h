#pragma once
// Losses for segmentation: scores (N, C, H, W) against class indices (N, H, W), the classes on axis 1.
//   pixel_cross_entropy  cross entropy of every pixel, averaged (fastai's CrossEntropyLossFlat(axis=1))
//   dice_loss            1 - the soft dice of each item and class (softmax scores against one-hot targets, summed over
//                        the pixels), averaged over items and classes. fastai's DiceLoss sums them by default, which
//                        scales the loss and its gradients with the batch size and the class count: the mean here is
//                        fastai's DiceLoss(reduction="mean")
//   cross_entropy_dice   pixel_cross_entropy + dice_weight * dice_loss
// Each activates with a softmax over axis 1 and decodes by its argmax (a mask of class indices).
#include <fastlearn/learner/loss.h>

namespace fastlearn {

/// "pixel_cross_entropy".
Loss pixel_cross_entropy(CrossEntropyOptions options = {});

struct DiceLossOptions {
  double smooth = 1e-6;          ///< added to both sides of the ratio: a class absent from an item scores 1, not 0/0
  bool square_in_union = false;  ///< the scores squared in the denominator (fastai's square_in_union)
};

/// "dice_loss".
Loss dice_loss(DiceLossOptions options = {});

/// "cross_entropy_dice": the sum, the dice term weighted by `dice_weight` (>= 0).
Loss cross_entropy_dice(double dice_weight = 1.0, DiceLossOptions dice = {});

}  // namespace fastlearn
