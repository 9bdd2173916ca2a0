#pragma once
// fastai's collab_learner: a model of collaborative filtering for CollabDataLoaders' ratings, fastai's
// EmbeddingDotBias (n_factors per user and item, plus a bias each) or, with use_nn, its EmbeddingNN, trained with
// mean squared error (fastai's MSELossFlat) and fastai's Adam; and what to ask a trained one: the rating of a user
// for an item, and the items to recommend to a user.
#include <fastlearn/data/collab_dataloaders.h>
#include <fastlearn/learner/learner.h>

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace fastlearn {

struct CollabLearnerOptions {
  std::int64_t n_factors = 50;  ///< EmbeddingDotBias: the factors of each user and item
  bool use_nn = false;          ///< fastai's EmbeddingNN instead
  /// use_nn: embedding widths by column name (the user's or the item's; others: fastai's emb_sz_rule)
  std::map<std::string, std::int64_t> emb_szs;
  std::vector<std::int64_t> layers;                  ///< use_nn: hidden sizes (empty: {n_factors}, as fastai)
  std::optional<std::pair<double, double>> y_range;  ///< ratings squashed into (low, high) (none: as they come)
};

/// The model for a ratings table's loaders, with the forward that runs it on a batch's codes and its copier.
struct CollabModel {
  std::shared_ptr<torch::nn::Module> module;  ///< models::EmbeddingDotBias, or models::TabularModel (EmbeddingNN)
  ForwardOutputs forward;
  Replicate replicate;
};
/// ConfigError when `dls` is not a ratings table's (CollabDataLoaders, or an export's) or an emb_szs name is not
/// its user or item column.
CollabModel collab_model(const DataLoaders& dls, const CollabLearnerOptions& options = {});

/// A Learner over collab_model(dls, options), mean squared error, the learner options' optimizer (Adam, wd 0.01).
std::unique_ptr<Learner> collab_learner(DataLoaders dls, const CollabLearnerOptions& options = {},
                                        LearnerOptions learner_options = {});

/// The model's rating of `item` by `user` (eval mode, no gradients). DataError naming the one that is not among
/// the training rows' users or items.
double predict_rating(Learner& learn, const std::string& user, const std::string& item);

struct Recommendation {
  std::string item;
  double rating;  ///< the model's rating of it for the user
};
/// The `k` items of the highest predicted ratings for `user`, best first, leaving out `exclude` (what the user
/// has rated already: a model or an export holds no ratings, so the caller gives them; names the model never saw
/// are ignored). Fewer when fewer are left. DataError when `user` is not among the training rows' users.
std::vector<Recommendation> recommend(Learner& learn, const std::string& user, std::int64_t k,
                                      const std::vector<std::string>& exclude = {});

}  // namespace fastlearn
