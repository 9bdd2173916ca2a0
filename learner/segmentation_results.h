#pragma once
// What a segmentation model gets right and wrong on the validation set: fastai's show_results as a PNG (each item's
// image, its true mask and the predicted mask side by side, a colour per class) and the items with the highest loss.
// Both read the validation loader batch by batch: no prediction of the whole set is kept.
#include <fastlearn/learner/learner.h>

#include <cstdint>
#include <filesystem>
#include <vector>

namespace fastlearn {

struct ShowResultsOptions {
  /// The validation items to draw, by index (default: the first `n`).
  std::vector<std::int64_t> items;
  std::int64_t n = 4;
};

/// Writes `file` (a PNG, atomically, its folder created): a row per item, its image, its true mask and the predicted
/// mask, the masks coloured by class (class 0 black, then the same colour for a class everywhere). ConfigError when
/// `learn`'s data is not segmentation images (SegmentationDataLoaders); DataError for an index out of the set.
void show_results(Learner& learn, const std::filesystem::path& file, const ShowResultsOptions& options = {});

struct ItemLoss {
  std::int64_t index = 0;  ///< in the validation set
  double loss = 0;         ///< the learner's loss over this item alone
};

/// The `k` validation items with the highest loss, highest first (all of them when k exceeds the set). The loss of
/// each is the learner's loss function over that item alone, in eval mode, recovered from the probabilities: the loss
/// must activate with a softmax over the classes (the segmentation losses; ConfigError otherwise).
std::vector<ItemLoss> segmentation_top_losses(Learner& learn, std::int64_t k);

}  // namespace fastlearn
