#pragma once
// fastai's TabularModel: an embedding per categorical input (dropout embed_p over their concatenation),
// BatchNorm over the continuous inputs, then per hidden size Linear (no bias) -> ReLU -> BatchNorm ->
// Dropout, and a final Linear to the outputs (optionally squashed into y_range by a scaled sigmoid). The
// parameter names are fastai's (embeds.0.weight, bn_cont.*, layers.0.0.weight, ...), so state dicts carry over.
#include <fastlearn/models/dropout.h>
#include <torch/nn/cloneable.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/container/sequential.h>

#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

namespace fastlearn::models {

/// fastai's rule of thumb for an embedding's width: min(600, round(1.6 * n_cat^0.56)).
std::int64_t emb_sz_rule(std::int64_t n_cat);

struct TabularModelOptions {
  std::vector<std::int64_t> layers{200, 100};        ///< hidden sizes
  std::vector<double> ps;                            ///< dropout after each hidden layer (default: none)
  double embed_p = 0.0;                              ///< dropout over the concatenated embeddings
  std::optional<std::pair<double, double>> y_range;  ///< regression outputs squashed into (low, high)
  bool use_bn = true;                                ///< BatchNorm after each hidden layer
  bool bn_final = false;                             ///< BatchNorm after the last layer too
  bool bn_cont = true;                               ///< BatchNorm over the continuous inputs
  /// Without continuous inputs, a BatchNorm of none all the same (fastai's EmbeddingNN has one, so its state dict
  /// names bn_cont.*); off: no bn_cont, as the tabular models of earlier builds were saved.
  bool empty_bn_cont = false;
};

class TabularModelImpl : public torch::nn::Cloneable<TabularModelImpl> {
 public:
  /// `emb_szs`: per categorical input, (vocabulary size, embedding width).
  TabularModelImpl(std::vector<std::pair<std::int64_t, std::int64_t>> emb_szs, std::int64_t n_cont, std::int64_t out_sz,
                   TabularModelOptions options = {});
  /// x_cat (N, categorical inputs) int64 codes, x_cont (N, continuous inputs) float.
  at::Tensor forward(const at::Tensor& x_cat, const at::Tensor& x_cont);
  /// Builds the layers from the constructor's arguments (fastai's initialization); clone() copies the values after it.
  void reset() override;

 private:
  std::vector<std::pair<std::int64_t, std::int64_t>> emb_szs_;
  std::int64_t out_sz_;
  TabularModelOptions options_;
  torch::nn::ModuleList embeds_;
  Dropout emb_drop_{nullptr};
  bool bn_cont_ = false;  // called by name (batch_norm_forward), so that SyncBatchNorm can take its place
  torch::nn::Sequential layers_;
  std::int64_t n_cont_;
  std::optional<std::pair<double, double>> y_range_;
};
TORCH_MODULE(TabularModel);

}  // namespace fastlearn::models
