#include <fastlearn/models/collab.h>

#include <fastlearn/core/error.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/torch.h>

namespace fastlearn::models {

EmbeddingDotBiasImpl::EmbeddingDotBiasImpl(std::int64_t n_factors, std::int64_t n_users, std::int64_t n_items,
                                           std::optional<std::pair<double, double>> y_range)
    : n_factors_(n_factors), n_users_(n_users), n_items_(n_items), y_range_(y_range) {
  if (n_factors < 1 || n_users < 1 || n_items < 1)
    throw ConfigError(fmt::format("EmbeddingDotBias: {} factors, {} users, {} items: each must be at least 1",
                                  n_factors, n_users, n_items));
  if (y_range && !(y_range->first < y_range->second))
    throw ConfigError(fmt::format("EmbeddingDotBias: y_range ({}, {}) is empty", y_range->first, y_range->second));
  reset();
}

void EmbeddingDotBiasImpl::reset() {
  const auto embedding = [this](const char* name, std::int64_t n, std::int64_t width) {
    auto e = register_module(name, torch::nn::Embedding(n, width));
    torch::NoGradGuard no_grad;
    e->weight.normal_().fmod_(2).mul_(0.01);  // fastai's trunc_normal_(std=0.01)
    return e;
  };
  u_weight = embedding("u_weight", n_users_, n_factors_);
  i_weight = embedding("i_weight", n_items_, n_factors_);
  u_bias = embedding("u_bias", n_users_, 1);
  i_bias = embedding("i_bias", n_items_, 1);
}

at::Tensor EmbeddingDotBiasImpl::forward(const at::Tensor& x) {
  if (x.dim() != 2 || x.size(1) != 2)
    throw ConfigError(fmt::format("EmbeddingDotBias: the batch has shape [{}], not (N, 2) codes (user, item)",
                                  fmt::join(x.sizes(), ", ")));
  const auto users = x.select(1, 0), items = x.select(1, 1);
  auto res = (u_weight->forward(users) * i_weight->forward(items)).sum(1) + u_bias->forward(users).squeeze(1) +
             i_bias->forward(items).squeeze(1);
  if (!y_range_) return res;
  return torch::sigmoid(res) * (y_range_->second - y_range_->first) + y_range_->first;
}

TabularModel embedding_nn(std::vector<std::pair<std::int64_t, std::int64_t>> emb_szs, TabularModelOptions options) {
  if (emb_szs.size() != 2)
    throw ConfigError(fmt::format("EmbeddingNN: {} embeddings; it takes the users' and the items'", emb_szs.size()));
  options.empty_bn_cont = true;  // fastai's EmbeddingNN has bn_cont = BatchNorm1d(0): its state dict names it
  return TabularModel(std::move(emb_szs), 0, 1, std::move(options));
}

}  // namespace fastlearn::models
