#pragma once
// fastai's plot_top_losses as a file: the items a classifier got most wrong, each image with its
// predicted and actual class, its loss and the probability of the prediction, in one SVG grid (the
// images are embedded as PNG, so the file stands alone and opens in any browser).
#include <fastlearn/data/dataset.h>
#include <fastlearn/learner/interpretation.h>

#include <cstdint>
#include <filesystem>

namespace fastlearn {

struct TopLossesGridOptions {
  int columns = 4;
  int cell = 160;  ///< pixels per image side in the grid (small images are scaled up, pixels kept sharp)
};

/// Writes the `k` items of `interp` with the highest loss to `file` (atomically, creating its folder).
/// `items` is the dataset the predictions were made on, in the same order (the validation set): its
/// images are drawn as it gives them, after item transforms, so they must be uint8 (C, H, W) with 1 or 3
/// channels. A DataError says so otherwise.
void save_top_losses_grid(const ClassificationInterpretation& interp, const Dataset& items, std::int64_t k,
                          const std::filesystem::path& file, TopLossesGridOptions options = {});

}  // namespace fastlearn
