#include <fastlearn/learner/collab_interpretation.h>

#include <fastlearn/core/detail/svg_plot.h>
#include <fastlearn/core/detail/text.h>
#include <fastlearn/core/error.h>
#include <fastlearn/data/collab_dataloaders.h>
#include <fastlearn/models/collab.h>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/torch.h>

#include <algorithm>
#include <numeric>

namespace fastlearn {

namespace {

models::EmbeddingDotBiasImpl& dot_bias_model(Learner& learn, std::string_view who) {
  auto* model = dynamic_cast<models::EmbeddingDotBiasImpl*>(&learn.model());
  if (model == nullptr || !collab_classes(learn.dls()))
    throw ConfigError(
        fmt::format("{}: the model is not an EmbeddingDotBias of a ratings table (collab_learner "
                    "without use_nn makes one)",
                    who));
  return *model;
}

at::Tensor lookup(Learner& learn, const std::vector<std::string>& names, bool is_item, bool bias,
                  std::string_view who) {
  auto& model = dot_bias_model(learn, who);
  const auto idx = collab_codes(learn.dls(), names, is_item, true, who);
  torch::NoGradGuard no_grad;
  auto& table = bias ? (is_item ? model.i_bias : model.u_bias) : (is_item ? model.i_weight : model.u_weight);
  auto out = table->weight.index_select(0, idx.to(table->weight.device())).to(torch::kCPU);
  return bias ? out.squeeze(1) : out;
}

}  // namespace

at::Tensor collab_bias(Learner& learn, const std::vector<std::string>& names, bool is_item) {
  return lookup(learn, names, is_item, true, "collab_bias");
}

at::Tensor collab_weight(Learner& learn, const std::vector<std::string>& names, bool is_item) {
  return lookup(learn, names, is_item, false, "collab_weight");
}

std::vector<RankedItem> items_by_bias(Learner& learn, std::int64_t k, bool most_liked,
                                      const std::vector<std::string>& among) {
  dot_bias_model(learn, "items_by_bias");
  if (k < 0) throw ConfigError(fmt::format("items_by_bias: k = {} is negative", k));
  auto names = among;
  if (names.empty()) {
    const auto classes = collab_classes(learn.dls());
    names.assign(classes->items.begin() + 1, classes->items.end());  // not "#na#"
  }
  const auto biases = collab_bias(learn, names).to(torch::kDouble).contiguous();
  const auto* b = biases.data_ptr<double>();
  std::vector<std::size_t> order(names.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  const auto take = std::min<std::size_t>(static_cast<std::size_t>(k), order.size());
  std::partial_sort(
      order.begin(), order.begin() + static_cast<std::ptrdiff_t>(take), order.end(),
      [&](std::size_t x, std::size_t y) { return b[x] != b[y] ? (most_liked ? b[x] > b[y] : b[x] < b[y]) : x < y; });
  std::vector<RankedItem> out;
  for (std::size_t i = 0; i < take; ++i) out.push_back({names[order[i]], b[order[i]]});
  return out;
}

at::Tensor pca(const at::Tensor& x, std::int64_t k) {
  if (x.dim() != 2 || k < 1 || k > x.size(1))
    throw ConfigError(fmt::format("pca: x of shape [{}] and k = {}: needs (n, d) rows and 1 <= k <= d",
                                  fmt::join(x.sizes(), ", "), k));
  const auto centred = x - x.mean(0);
  // fastai's: U of the SVD of x's transpose, whose columns are the principal directions.
  const auto [u, s, vh] = at::linalg_svd(centred.t(), /*full_matrices=*/false);
  return centred.mm(u.narrow(1, 0, k));
}

void plot_item_factors(Learner& learn, const std::vector<std::string>& items, const std::filesystem::path& file) {
  if (items.size() < 2) throw ConfigError("plot_item_factors: give at least 2 items");
  const auto factors = collab_weight(learn, items).to(torch::kDouble);
  if (factors.size(1) < 2) throw ConfigError("plot_item_factors: the model has fewer than 2 factors");
  const auto xy = pca(factors, 2).contiguous();
  PlotSeries points{.label = "", .markers = true, .point_labels = items};
  for (std::int64_t i = 0; i < xy.size(0); ++i) {
    points.x.push_back(xy[i][0].item<double>());
    points.y.push_back(xy[i][1].item<double>());
  }
  write_svg_plot(file, {points},
                 {.title = "Items' factors, first two principal components",
                  .xlabel = "first component",
                  .ylabel = "second component"});
}

}  // namespace fastlearn
