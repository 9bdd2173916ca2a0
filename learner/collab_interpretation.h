#pragma once
// What a trained EmbeddingDotBias says about the items and users, as fastai's collaborative-filtering lesson reads
// it: each one's bias (how much it is liked whatever the user), its factors, the items ranked by bias, and a picture of
// the items' factors along their first two principal components.
#include <fastlearn/learner/learner.h>

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

namespace fastlearn {

/// fastai's model.bias(names, is_item): the biases of these items (users when `is_item` is false), (n). ConfigError
/// when the model is not an EmbeddingDotBias of a ratings table; DataError naming a name the training rows lacked.
at::Tensor collab_bias(Learner& learn, const std::vector<std::string>& names, bool is_item = true);
/// fastai's model.weight(names, is_item): their factors, (n, n_factors).
at::Tensor collab_weight(Learner& learn, const std::vector<std::string>& names, bool is_item = true);

struct RankedItem {
  std::string item;
  double bias;
};
/// The `k` items of the highest bias (most liked whatever the user), or with `most_liked` false of the lowest, among
/// `among` (empty: every item the model knows).
std::vector<RankedItem> items_by_bias(Learner& learn, std::int64_t k, bool most_liked = true,
                                      const std::vector<std::string>& among = {});

/// fastai's Tensor.pca: the rows of `x` (n, d) centred and projected on their first `k` principal components, (n, k).
at::Tensor pca(const at::Tensor& x, std::int64_t k = 2);

/// Writes an SVG scatter plot of `items` (at least 2) along the first two principal components of their factors,
/// each point named, to `file` (its folder created).
void plot_item_factors(Learner& learn, const std::vector<std::string>& items, const std::filesystem::path& file);

}  // namespace fastlearn
