#include <fastlearn/models/tabular_model.h>

#include <fastlearn/core/error.h>
#include <fastlearn/models/norm_layer.h>
#include <fastlearn/models/sequential_block.h>
#include <fmt/format.h>
#include <torch/torch.h>

#include <cmath>

namespace fastlearn::models {

namespace nn = torch::nn;

std::int64_t emb_sz_rule(std::int64_t n_cat) {
  return std::min<std::int64_t>(600, std::llround(1.6 * std::pow(static_cast<double>(n_cat), 0.56)));
}

TabularModelImpl::TabularModelImpl(std::vector<std::pair<std::int64_t, std::int64_t>> emb_szs, std::int64_t n_cont,
                                   std::int64_t out_sz, TabularModelOptions o)
    : emb_szs_(std::move(emb_szs)),
      out_sz_(out_sz),
      options_(std::move(o)),
      n_cont_(n_cont),
      y_range_(options_.y_range) {
  const auto& opts = options_;
  if (n_cont < 0 || out_sz < 1 || (emb_szs_.empty() && n_cont == 0) || opts.embed_p < 0 || opts.embed_p >= 1) {
    throw ConfigError(
        fmt::format("TabularModel: {} categorical and {} continuous inputs, {} outputs, embed_p {}: "
                    "needs some input, at least one output, embed_p in [0, 1)",
                    emb_szs_.size(), n_cont, out_sz, opts.embed_p));
  }
  if (!opts.ps.empty() && opts.ps.size() != opts.layers.size()) {
    throw ConfigError(fmt::format("TabularModel: {} dropout values for {} layers", opts.ps.size(), opts.layers.size()));
  }
  reset();
}

void TabularModelImpl::reset() {
  const auto& o = options_;
  const auto n_cont = n_cont_;
  embeds_ = register_module("embeds", nn::ModuleList());
  std::int64_t n_emb = 0;
  for (const auto& [n, width] : emb_szs_) {
    if (n < 1 || width < 1) throw ConfigError(fmt::format("TabularModel: embedding ({}, {}) is empty", n, width));
    nn::Embedding embedding(n, width);
    // fastai's trunc_normal_(std=0.01): a normal draw folded into (-2, 2) standard deviations.
    torch::NoGradGuard no_grad;
    embedding->weight.normal_().fmod_(2).mul_(0.01);
    embeds_->push_back(embedding);
    n_emb += width;
  }
  emb_drop_ = register_module("emb_drop", Dropout(o.embed_p));
  bn_cont_ = o.bn_cont && n_cont > 0;
  if (bn_cont_) register_module("bn_cont", nn::BatchNorm1d(n_cont));
  if (o.bn_cont && n_cont == 0 && o.empty_bn_cont) register_module("bn_cont", nn::BatchNorm1d(0));
  std::vector<std::int64_t> sizes{n_emb + n_cont};
  sizes.insert(sizes.end(), o.layers.begin(), o.layers.end());
  sizes.push_back(out_sz_);
  layers_ = nn::Sequential();
  for (std::size_t i = 0; i + 1 < sizes.size(); ++i) {
    const bool last = i + 2 == sizes.size();
    const bool bn = o.use_bn && (!last || o.bn_final);
    const double p = last || o.ps.empty() ? 0.0 : o.ps[i];
    if (sizes[i + 1] < 1) throw ConfigError(fmt::format("TabularModel: layer size {} must be positive", sizes[i + 1]));
    // fastai's LinBnDrop with lin_first: Linear (bias only without BatchNorm), activation, BatchNorm, Dropout.
    SequentialBlock block;
    block->push_back(nn::Linear(nn::LinearOptions(sizes[i], sizes[i + 1]).bias(!bn)));
    if (!last) block->push_back(nn::ReLU(nn::ReLUOptions().inplace(true)));
    if (bn) block->push_back(nn::BatchNorm1d(sizes[i + 1]));
    if (p != 0) block->push_back(Dropout(p));
    layers_->push_back(block);
  }
  register_module("layers", layers_);
}

at::Tensor TabularModelImpl::forward(const at::Tensor& x_cat, const at::Tensor& x_cont) {
  std::vector<at::Tensor> parts;
  if (!embeds_->is_empty()) {
    std::vector<at::Tensor> embedded;
    for (std::size_t i = 0; i < embeds_->size(); ++i) {
      embedded.push_back(embeds_[i]->as<nn::Embedding>()->forward(x_cat.select(1, static_cast<std::int64_t>(i))));
    }
    parts.push_back(emb_drop_->forward(torch::cat(embedded, 1)));
  }
  if (n_cont_ > 0) parts.push_back(bn_cont_ ? batch_norm_forward(*named_children()["bn_cont"], x_cont) : x_cont);
  auto x = layers_->forward(parts.size() == 1 ? parts.front() : torch::cat(parts, 1));
  if (y_range_) x = torch::sigmoid(x) * (y_range_->second - y_range_->first) + y_range_->first;
  return x;
}

}  // namespace fastlearn::models
