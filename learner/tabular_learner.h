#pragma once
// fastai's tabular_learner: a TabularModel sized for TabularDataLoaders' data (an embedding per categorical
// input, fastai's rule of thumb for its width unless given), with cross entropy for a categorical target
// or mean squared error for regression.
#include <fastlearn/data/tabular_dataloaders.h>
#include <fastlearn/learner/learner.h>
#include <fastlearn/models/tabular_model.h>

#include <map>
#include <memory>
#include <string>

namespace fastlearn {

struct TabularLearnerOptions {
  std::vector<std::int64_t> layers{200, 100};   ///< hidden sizes
  std::map<std::string, std::int64_t> emb_szs;  ///< embedding widths by column name (others: emb_sz_rule)
  std::vector<double> ps;                       ///< dropout after each hidden layer (default: none)
  double embed_p = 0.0;
  std::optional<std::pair<double, double>> y_range;  ///< regression: outputs squashed into (low, high)
};

/// The model for `dls` (made by TabularDataLoaders; ConfigError otherwise, or for an emb_szs name that is
/// not a categorical input).
models::TabularModel tabular_model(const DataLoaders& dls, const TabularLearnerOptions& options = {});

/// A Learner over tabular_model(dls, options).
std::unique_ptr<Learner> tabular_learner(DataLoaders dls, const TabularLearnerOptions& options = {},
                                         LearnerOptions learner_options = {});

}  // namespace fastlearn
