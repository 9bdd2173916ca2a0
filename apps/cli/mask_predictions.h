#pragma once
// `fastlearn predict` for a segmentation model: each image's mask at the image's own size (learner/predict_mask.h)
// written to OUT as a PNG of class indices (grey, one byte a pixel) under the image's name, a line per image with
// each class's share of the pixels, and OUT/masks.csv (input, mask file, then each code's share).
#include <fastlearn/learner/learner.h>

#include <string>
#include <vector>

namespace fastlearn::cli {

/// Predicts the image files and folders `inputs`; an input that does not decode (or that would overwrite another's
/// mask) is reported on stderr and the others are still predicted. Returns the exit code (1 when any failed).
int predict_mask_files(Learner& learn, const std::vector<std::string>& inputs, const std::string& out);

}  // namespace fastlearn::cli
