#pragma once
// Predictions by name for batches: each row of get_preds' activations (over a test_dl of new items) named as the
// data names its outputs: the most probable class and its probability, every class at or above the threshold
// (multi-label), or each target's name and value (regression). What `fastlearn predict` prints and writes.
#include <fastlearn/learner/learner.h>

#include <string>
#include <utility>
#include <vector>

namespace fastlearn {

/// One item's prediction: (class, probability) pairs, most probable first, or (target, value) pairs in target order.
using NamedPrediction = std::vector<std::pair<std::string, double>>;

/// Each row of `preds` (N, c) named by `learn`'s data: its vocabulary (a class without names is its index, "3"), a
/// multi-label threshold, a regression's target names (a table's y_names, else "0", "1", ...). ConfigError when
/// `preds` has another number of columns than the data's outputs.
std::vector<NamedPrediction> name_predictions(const at::Tensor& preds, Learner& learn, double threshold = 0.5);

/// Whether `learn`'s outputs are values (regression) rather than class scores.
bool predicts_values(Learner& learn);

/// The names of `learn`'s outputs, in column order: its classes, or its targets.
std::vector<std::string> output_names(Learner& learn);

/// "Sandal 0.973", "Bag 0.910, Sandal 0.620" (multi-label; "-" when none reaches the threshold); with `significant`,
/// six significant digits instead of three decimals ("income 51234.5", a table's "<50k 0.913003").
std::string describe(const NamedPrediction& prediction, bool significant);

}  // namespace fastlearn
