#pragma once
// ClassificationInterpretation (fastai's): where a single-label classifier goes wrong on a set. From the
// learner's predictions (get_preds): the confusion matrix, the most confused pairs of classes, and the
// items with the highest loss (cross entropy: -log of the probability given to the actual class).
#include <fastlearn/learner/learner.h>

#include <cstdint>
#include <string>
#include <vector>

namespace fastlearn {

class ClassificationInterpretation {
 public:
  /// `probs`: (N, c) class probabilities; `targets`: (N) class indices; `vocab`: c names (empty: "0", "1", ...).
  ClassificationInterpretation(at::Tensor probs, at::Tensor targets, std::vector<std::string> vocab = {});
  /// The predictions of `learn` on `dl` (default: the validation loader), with the data's class names.
  static ClassificationInterpretation from_learner(Learner& learn, DataLoader* dl = nullptr);

  /// (c, c) counts: row = actual class, column = predicted class (argmax).
  at::Tensor confusion_matrix() const;

  struct Confused {
    std::string actual, predicted;
    std::int64_t count = 0;
  };
  /// The off-diagonal cells with at least `min_count` items, most first (ties: by actual, then predicted).
  std::vector<Confused> most_confused(std::int64_t min_count = 1) const;

  struct Loss {
    std::int64_t index = 0;  ///< the item's position in the loader's (unshuffled) order
    double loss = 0;         ///< -log(probability of the actual class)
    std::string actual, predicted;
    double probability = 0;  ///< of the predicted class
  };
  /// The `k` items with the highest loss, highest first.
  std::vector<Loss> top_losses(std::int64_t k) const;

  const std::vector<std::string>& vocab() const { return vocab_; }

 private:
  at::Tensor probs_, targets_, predicted_;
  std::vector<std::string> vocab_;
};

}  // namespace fastlearn
