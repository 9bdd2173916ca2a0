#pragma once
// fastai's two models of collaborative filtering, under fastai's names so that state dicts carry over both ways:
//   EmbeddingDotBias  a factor vector and a bias per user and per item (the embeddings u_weight, i_weight, u_bias,
//                     i_bias: the biases are embeddings, so weight decay reaches them as in fastai), a rating being
//                     the dot product of the two vectors plus both biases, squashed into y_range by a scaled sigmoid
//                     when one is given;
//   EmbeddingNN       fastai's TabularModel over the user's and the item's embeddings, without continuous inputs
//                     (embeds.0, embeds.1, an empty bn_cont, layers.*), one output.
// Both take a batch of codes (N, 2) int64, the user's then the item's, as CollabDataLoaders gives them.
#include <fastlearn/models/tabular_model.h>
#include <torch/nn/cloneable.h>
#include <torch/nn/modules/embedding.h>

#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

namespace fastlearn::models {

class EmbeddingDotBiasImpl : public torch::nn::Cloneable<EmbeddingDotBiasImpl> {
 public:
  /// Each embedding drawn as fastai's (trunc_normal_, std 0.01).
  EmbeddingDotBiasImpl(std::int64_t n_factors, std::int64_t n_users, std::int64_t n_items,
                       std::optional<std::pair<double, double>> y_range = std::nullopt);
  /// x (N, 2) codes -> the ratings (N).
  at::Tensor forward(const at::Tensor& x);
  void reset() override;

  std::int64_t n_factors() const { return n_factors_; }
  const std::optional<std::pair<double, double>>& y_range() const { return y_range_; }

  torch::nn::Embedding u_weight{nullptr}, i_weight{nullptr}, u_bias{nullptr}, i_bias{nullptr};

 private:
  std::int64_t n_factors_, n_users_, n_items_;
  std::optional<std::pair<double, double>> y_range_;
};
TORCH_MODULE(EmbeddingDotBias);

/// fastai's EmbeddingNN: a TabularModel of the embeddings `emb_szs` ((users, width), (items, width)), no continuous
/// input and one output; `options.layers` are its hidden sizes. Run it on codes alone with an empty continuous tensor
/// (collab_learner's forward does).
TabularModel embedding_nn(std::vector<std::pair<std::int64_t, std::int64_t>> emb_szs, TabularModelOptions options);

}  // namespace fastlearn::models
