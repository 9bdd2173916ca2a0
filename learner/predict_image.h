#pragma once
// Predictions for image files: the file goes through the validation pipeline of the learner's data
// (decoded and resized as the validation items are, then its batch transforms), the model runs in eval
// mode, and the result names the classes (the data's vocabulary).
#include <fastlearn/learner/learner.h>

#include <filesystem>
#include <string>
#include <utility>
#include <vector>

namespace fastlearn {

struct ImagePrediction {
  /// Single label: the most probable class and its probability. Multi-label: every class whose
  /// probability is at least the threshold, most probable first.
  std::vector<std::pair<std::string, double>> classes;
  at::Tensor probs;  ///< every class's probability (softmax, or sigmoid for multi-label), on the CPU
};

/// `file` through the validation pipeline of `learn`'s data, which must be image files with a vocabulary
/// (ImageDataLoaders::from_folder and the like); DataError naming the file when it does not decode.
ImagePrediction predict_image(Learner& learn, const std::filesystem::path& file, double threshold = 0.5);

/// "Sandal 0.973" or, for several classes, "Bag 0.91, Sandal 0.62" ("-" when none passes the threshold).
std::string describe(const ImagePrediction& prediction);

}  // namespace fastlearn
